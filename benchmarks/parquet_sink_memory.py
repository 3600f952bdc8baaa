"""The agent's requests.parquet writer under many small polls: memory, time per write, row groups.

`infersight agent --parquet-dir` hands ParquetSink each poll's finished requests, a few rows. Written as a
row group each (the sink before 2026-12-05; here `--rows-per-group 1`), the writer keeps every row
group's metadata until it closes. Each arm runs in a fresh process: --writes writes of --rows rows shaped
like the agent's (ids, a trace id, task, timings), VmRSS read from /proc every quarter, the file's row
groups and footer size read back at the end; all measured.

    python benchmarks/parquet_sink_memory.py --writes 12000 --rows 2     # a poll's rows, ~20 min of polls

Prints one line per arm and quarter, then one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))


def one_arm(rows_per_group: int, writes: int, rows: int) -> dict:
    sys.path.insert(0, str(REPO))
    import pyarrow.parquet as pq

    from infersight.exporters.parquet import ParquetSink

    path = Path(tempfile.mkdtemp(prefix="infersight-psink-")) / "requests.parquet"
    sink = ParquetSink(path, rows_per_group=rows_per_group)
    base, quarters = rss_mb(), []
    started = time.perf_counter()
    for k in range(writes):
        sink.write([{"request_id": rows * k + j, "trace_id": f"{rows * k + j:032x}", "task": "chat", "e2e_s": 0.5,
                     "ttft_s": 0.1, "output_tokens": 32, "finish_reason": "length", "slow_cause": ""}
                    for j in range(rows)])
        if (k + 1) % max(1, writes // 4) == 0:
            quarters.append(round(rss_mb() - base, 1))
    per_write_ms = (time.perf_counter() - started) * 1e3 / writes
    sink.close()
    meta = pq.ParquetFile(path).metadata
    return {"rows_per_group": rows_per_group, "rss_growth_mb_by_quarter": quarters, "ms_per_write": per_write_ms,
            "row_groups": meta.num_row_groups, "rows": meta.num_rows, "footer_bytes": meta.serialized_size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writes", type=int, default=12_000)
    ap.add_argument("--rows", type=int, default=2, help="rows per write (a poll's finished requests)")
    ap.add_argument("--arm", type=int, help=argparse.SUPPRESS)  # one arm, in this process (the child)
    args = ap.parse_args()
    if args.arm is not None:
        print(json.dumps(one_arm(args.arm, args.writes, args.rows)))
        return 0
    arms = []
    for rows_per_group in (1, 10_000):  # a row group per write (as before), the default
        out = subprocess.run([sys.executable, __file__, "--arm", str(rows_per_group), "--writes", str(args.writes),
                              "--rows", str(args.rows)], capture_output=True, text=True, check=True)
        arm = json.loads(out.stdout.strip().splitlines()[-1])
        arms.append(arm)
        print(f"rows_per_group {rows_per_group:>6}: RSS growth by quarter {arm['rss_growth_mb_by_quarter']} MB, "
              f"{arm['ms_per_write']:.3f} ms a write, {arm['row_groups']} row groups for {arm['rows']} rows, "
              f"footer {arm['footer_bytes'] / 1e6:.2f} MB")
    print(json.dumps({"measured": True, "how": "VmRSS from /proc, perf_counter, the file's metadata read back",
                      "writes": args.writes, "rows": args.rows, "arms": arms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
