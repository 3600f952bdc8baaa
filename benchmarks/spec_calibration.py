"""Calibrate spec_speedup.MODEL_ERROR: how far the predicted speedup falls from the measured one
on runs of `infersight bench speculation` that are NOT the CI test's (tests/bench/speculation/test_spec_ab.py
uses seed 0; these use other seeds and batch sizes).

Each run is a worker process pinned to one core (taskset), one torch thread, so that runs in
parallel do not slow each other down much. Prints one line per (run, task), then the error
statistics of log(predicted / measured), with and without the model-error term, and the share of
tasks whose measured speedup lies in the printed interval. Full results: --out (JSON lines).

    python benchmarks/spec_calibration.py --seeds 101-110 --batches 4 8 --workers 10 --first-core 6
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TASKS = ("chat", "code", "creative", "json")


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def _run(core: int, args: argparse.Namespace, seed: int, batch: int) -> dict:
    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "infersight", "bench", "speculation", "--json",
           "--device", args.device, "--seed", str(seed), "--batch", str(batch), "--requests", str(args.requests),
           "--rounds", str(args.rounds), "--max-tokens", str(args.max_tokens)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        return {"seed": seed, "batch": batch, "error": done.stderr.strip().splitlines()[-1:]}
    return {"seed": seed, "batch": batch, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="101-110")
    ap.add_argument("--batches", type=int, nargs="+", default=[4])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--first-core", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    jobs = [(s, b) for s in _seeds(args.seeds) for b in args.batches]
    with ThreadPoolExecutor(args.workers) as pool:
        results = list(pool.map(lambda ij: _run(args.first_core + ij[0] % args.workers, args, *ij[1]),
                                enumerate(jobs)))
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in results))
    errors, inside, widths = [], 0, []
    for r in results:
        if "error" in r:
            print(f"seed {r['seed']} batch {r['batch']}: failed: {r['error']}")
            continue
        for t in TASKS:
            m, p = r.get(f"{t}.measured_speedup"), r.get(f"{t}.predicted_speedup")
            if not m or not p:
                continue
            low, high = r[f"{t}.predicted_interval"]
            errors.append(math.log(p / m))
            inside += low <= m <= high
            widths.append(math.log(high / p) / 2)  # the printed sigma (model error included)
            print(f"seed {r['seed']:4d} batch {r['batch']:3d} {t:9s} measured {m:.3f} {r[f'{t}.measured_rounds']} "
                  f"predicted {p:.3f} [{low:.3f}, {high:.3f}] advice {r[f'{t}.advice']}")
    if not errors:
        return 1
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    print(f"\n{len(errors)} task runs: log(predicted / measured) mean {statistics.mean(errors):+.4f}, "
          f"RMS {rms:.4f}, largest |.| {max(map(abs, errors)):.4f}; inside the printed interval "
          f"{inside}/{len(errors)}; printed sigma median {statistics.median(widths):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
