"""`infersight agent` with tracemalloc on: where the agent's heap grows while it serves real inputs.

The agent runs as `infersight agent ARGS` does (main thread, its signals); a daemon thread takes a
tracemalloc snapshot at --first-s and then every --every-s, and writes to --out the allocation sites
whose traced bytes grew most since the first snapshot (and since the previous one), with the traced
total and VmRSS (which here holds the snapshots themselves: compare the traced figures, not RSS).
benchmarks/agent_memory_soak.py starts it with --traced-agent, so the inputs are the soak's (probe
ring, vLLM KV events, OTLP spans, the recorder). tracemalloc slows the agent: measured at 8 requests/s
with every input on, a full core and polls of 1-20 s (0.05 s untraced at 20 requests/s), so its rates
mean nothing and a slower feed keeps it from dropping.

    python benchmarks/agent_traced.py --out growth.txt [--first-s 600] [--every-s 300] -- agent ARGS...
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infersight.bench.serving.process_cpu import process_memory_mb  # noqa: E402


def report(out: Path, label: str, now: tracemalloc.Snapshot, base: tracemalloc.Snapshot, top: int) -> None:
    lines = [f"== {label}: traced {tracemalloc.get_traced_memory()[0] / 2**20:.2f} MiB, RSS {process_memory_mb(os.getpid())['rss']:.1f} MB"]
    for stat in now.compare_to(base, "traceback")[:top]:
        where = " <- ".join(f"{Path(fr.filename).name}:{fr.lineno}" for fr in reversed(stat.traceback))
        lines.append(f"{stat.size_diff / 1024:+9.0f} KiB {stat.count_diff:+8d} blocks  {where}")
    with out.open("a") as f:
        f.write("\n".join(lines) + "\n")


def snapshots(out: Path, first_s: float, every_s: float, top: int) -> None:
    time.sleep(first_s)
    gc.collect()
    first = previous = tracemalloc.take_snapshot()
    report(out, f"t={first_s:.0f} s (first)", first, first, 0)
    t = first_s
    while True:
        time.sleep(every_s)
        t += every_s
        gc.collect()
        now = tracemalloc.take_snapshot()
        report(out, f"t={t:.0f} s, since the first snapshot", now, first, top)
        report(out, f"t={t:.0f} s, since the previous snapshot", now, previous, top)
        previous = now


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--first-s", type=float, default=600.0)
    ap.add_argument("--every-s", type=float, default=300.0)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("infersight_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    rest = args.infersight_args[1:] if args.infersight_args[:1] == ["--"] else args.infersight_args
    tracemalloc.start(args.frames)
    args.out.write_text("")
    threading.Thread(target=snapshots, args=(args.out, args.first_s, args.every_s, args.top), daemon=True).start()
    from infersight.cli import main as infersight_main

    return infersight_main(rest)


if __name__ == "__main__":
    sys.exit(main())
