"""The agent's ingest rate, this tree against another checkout, in fresh processes on one core.

Each run is one `infersight.bench.agent.ingest_poll(2048, 32)` poll (225 k records in 164 k ring
slots) in a new process pinned with taskset; runs alternate before / after / after again (the A/A
that gives the noise floor), and the medians are printed last. Rates are records (the per-record
rows the agent folds, as this tree's ring consumer counts them) over the CPU time of the poll: on a
loaded machine the wall clock also counts other processes' turns on the core. A tree from before
`ingest_poll` (it has `_ingest_rate`, which counted slots) is timed on the same workload and
credited with the records this tree counts for it.

    python3 benchmarks/ingest_ab.py --against /path/to/old/checkout --pairs 5 --core 3
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ONE_POLL = ("import json, infersight.bench.agent as b\n"
            "if hasattr(b, 'ingest_poll'):\n"
            "    p = b.ingest_poll(2048, 32); out = {'records': p.records, 'cpu_seconds': p.cpu_seconds}\n"
            "else:\n"
            "    r = b._ingest_rate(2048, 32); out = {'records': None, 'cpu_seconds': r[2]}\n"
            "print(json.dumps(out))")


def one_poll(root: Path, core: int, other: Path) -> tuple[int | None, float]:
    """(records the poll counted, None for an older tree; CPU seconds of the poll)."""
    # Wheels installed beside the tree (the GPU machine's /tmp/site) stay; the other tree never shadows root.
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != other]
    pin = ["taskset", "-c", str(core)] if shutil.which("taskset") else []
    out = subprocess.run([*pin, sys.executable, "-c", ONE_POLL], cwd=root, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *extra])})
    if out.returncode != 0:
        raise SystemExit(f"ingest_ab: the poll failed in {root}: {out.stderr.strip().splitlines()[-1:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return got["records"], got["cpu_seconds"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", required=True, help="the other checkout's root (before)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--core", type=int, default=1)
    args = ap.parse_args()
    before_root, after_root = Path(args.against).resolve(), Path(__file__).resolve().parents[1]
    if not (before_root / "infersight").is_dir() or args.pairs < 1:
        print("ingest_ab: --against must be a checkout root and --pairs >= 1", file=sys.stderr)
        return 2
    seconds: dict[str, list[float]] = {"before": [], "after": [], "after again": []}
    counted: set[int] = set()
    for i in range(args.pairs):
        order = list(seconds) if i % 2 == 0 else list(reversed(seconds))
        for name in order:
            root, other = (before_root, after_root) if name == "before" else (after_root, before_root)
            records, cpu_seconds = one_poll(root, args.core, other)
            seconds[name].append(cpu_seconds)
            if name != "before" and records is not None:
                counted.add(records)
        print(f"pair {i + 1}: " + ", ".join(f"{n} {seconds[n][-1] * 1e3:.1f} ms" for n in seconds) + " of CPU",
              flush=True)
    if len(counted) != 1:
        raise SystemExit(f"ingest_ab: this tree counted different records in its runs: {sorted(counted)}")
    records = counted.pop()
    med = {n: records / statistics.median(v) for n, v in seconds.items()}
    aa = [abs(a / b - 1) for a, b in zip(seconds["after"], seconds["after again"])]
    print(f"{records} records a poll; medians (M records/s of CPU time): before {med['before'] / 1e6:.3f}, "
          f"after {med['after'] / 1e6:.3f}, after again {med['after again'] / 1e6:.3f}; "
          f"after/before {med['after'] / med['before']:.2f}; A/A median {100 * statistics.median(aa):.1f}%, "
          f"max {100 * max(aa):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
