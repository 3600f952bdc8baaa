"""Does a torch.profiler window leave a cost behind in the process? A launch-bound loop (many
tiny kernels per "step", like our decode) is timed before and after one profiled window.

Variants (one process each, chosen by --variant): cuda (CPU + CUDA activities, as infersight's
capture), cpu (CPU activity only: no CUPTI), and none (no profiler: the noise floor). Also timed:
the same loop after gc.collect(), which separates a Python-heap effect from a CUPTI one.

    python benchmarks/profiler_residue.py --variant cuda     (TEARDOWN_CUPTI=0|1 in the environment)
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch


def step(x: torch.Tensor, kernels: int) -> None:
    for _ in range(kernels):
        x.add_(1e-6)
    torch.cuda.synchronize()


def timed(x: torch.Tensor, steps: int, kernels: int) -> float:
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(x, kernels)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=["cuda", "cpu", "none"], default="cuda")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--kernels", type=int, default=800)
    args = ap.parse_args()
    x = torch.zeros(1024, device="cuda")
    timed(x, 50, args.kernels)  # warm-up
    before = [timed(x, args.steps, args.kernels) for _ in range(3)]
    if args.variant != "none":
        acts = [torch.profiler.ProfilerActivity.CPU]
        if args.variant == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=acts, record_shapes=True)
        prof.start()
        timed(x, 20, args.kernels)
        prof.stop()
        del prof
    after = [timed(x, args.steps, args.kernels) for _ in range(3)]
    gc.collect()
    after_gc = [timed(x, args.steps, args.kernels) for _ in range(3)]
    b = statistics.median(before)
    print(f"{args.variant}: before {b * 1e3:.3f} ms/step (spread {max(before) / min(before):.3f}), "
          f"after {statistics.median(after) / b:.3f}x, after gc.collect {statistics.median(after_gc) / b:.3f}x")


if __name__ == "__main__":
    main()
