"""The agent's ingest rate, this tree against another checkout, in fresh processes on one core.

Each run is one `infersight.bench.agent._ingest_rate(2048, 32)` poll (225 k events) in a new
process pinned with taskset; runs alternate before / after / after again (the A/A that gives the
noise floor), and the medians are printed last. Wall time of the poll only; on a quiet pinned core
it equals the CPU time.

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

ONE_POLL = ("import json; from infersight.bench.agent import _ingest_rate; r = _ingest_rate(2048, 32); "
            "print(json.dumps({'events': r[0], 'seconds': r[1]}))")


def one_poll(root: Path, core: int, other: Path) -> float:
    # Wheels installed beside the tree (the GPU machine's /tmp/site) stay; the other tree never shadows root.
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != other]
    pin = ["taskset", "-c", str(core)] if shutil.which("taskset") else []
    out = subprocess.run([*pin, sys.executable, "-c", ONE_POLL], cwd=root, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *extra])})
    if out.returncode != 0:
        raise SystemExit(f"ingest_ab: the poll failed in {root}: {out.stderr.strip().splitlines()[-1:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return got["events"] / got["seconds"]


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
    rates: dict[str, list[float]] = {"before": [], "after": [], "after again": []}
    for i in range(args.pairs):
        order = list(rates) if i % 2 == 0 else list(reversed(rates))
        for name in order:
            root, other = (before_root, after_root) if name == "before" else (after_root, before_root)
            rates[name].append(one_poll(root, args.core, other))
        print(f"pair {i + 1}: " + ", ".join(f"{n} {rates[n][-1] / 1e6:.3f}" for n in rates) + " M events/s",
              flush=True)
    med = {n: statistics.median(v) for n, v in rates.items()}
    aa = [abs(a / b - 1) for a, b in zip(rates["after"], rates["after again"])]
    print(f"medians (M events/s): before {med['before'] / 1e6:.3f}, after {med['after'] / 1e6:.3f}, "
          f"after again {med['after again'] / 1e6:.3f}; after/before {med['after'] / med['before']:.2f}; "
          f"A/A median {100 * statistics.median(aa):.1f}%, max {100 * max(aa):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
