"""Does NVML GPM telemetry see what the GPU is doing? A GEMM, a copy and an idle phase, sampled.

Run on the GPU machine (CI has no GPU):

    python3 benchmarks/gpu_telemetry_check.py [--phase-s 2.0] [--interval-s 0.15]

While infersight's NvmlCollector (GPM on Hopper and newer) samples every `--interval-s` on the
GpuSampler thread, the script runs three phases of `--phase-s` seconds each:
  gemm  bf16 8192 x 8192 x 8192 matmuls (tensor pipes busy, DRAM moderately so);
  copy  1 GiB device-to-device copies (DRAM bandwidth bound, no tensor work);
  idle  nothing (the sampler keeps polling).
It prints the per-phase means of tensor_active, dram_active, sm_active and gr_engine_active,
then PASS/FAIL for: tensor > 0.3 only in gemm; dram > 0.3 in copy; tensor and dram < 0.05 idle.
The first `--settle-s` of each phase is left out: a GPM value averages the window that ends at
its timestamp, so the first sample of a phase still carries the previous one. With $OUT set,
every sample, the phase windows and the verdicts go to $OUT/gpu_telemetry_check.json.
Exit status: 0 all pass, 1 a check failed, 2 no CUDA / no NVML.

Comparing with Nsight Compute (--ncu). GPM and ncu read the same hardware counters, so they are
not run together: with --ncu the sampler is off and each phase runs a few kernels inside an NVTX
range (gemm, copy) for ncu to replay:

    ncu --clock-control none --nvtx --nvtx-include "gemm/" --nvtx-include "copy/" \\
        --metrics sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed \\
        --csv python3 benchmarks/gpu_telemetry_check.py --ncu > ncu.csv

Then set the ncu percentages (per kernel) beside the GPM means of the normal run: for the GEMM
kernel sm__throughput should be high (tens of %) where GPM shows high tensor_active and
sm_active; for the copy kernel dram__throughput should be high where GPM shows high dram_active
(GPM's DRAM_BW_UTIL and ncu's dram__throughput both measure bandwidth against the sustained
peak, so expect the same order of magnitude, not equal numbers: ncu times single kernels with
replay, GPM averages wall-clock windows that include launch gaps).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from infersight.gpu.fields import DRAM, SM, TENSOR
from infersight.gpu.frames import samples_frame, step_averages
from infersight.gpu.sampler import GpuSampler

PHASES = ("gemm", "copy", "idle")
GR = "gr_engine_active_ratio"
HIGH, LOW = 0.3, 0.05


def _work(torch: Any, phase_s: float) -> list[dict[str, Any]]:
    """Run the three phases; return their [start_ns, end_ns] windows (monotonic, after sync)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16, generator=g)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16, generator=g)
    src = torch.randn(512 << 20, device=dev, dtype=torch.bfloat16, generator=g)  # 1 GiB
    dst = torch.empty_like(src)
    for _ in range(3):  # warm up cuBLAS and the copy path
        torch.matmul(a, b)
        dst.copy_(src)
    torch.cuda.synchronize()
    windows = []
    for phase in PHASES:
        start = time.monotonic_ns()
        deadline = time.monotonic() + phase_s
        iters = 0
        while time.monotonic() < deadline:
            if phase == "gemm":
                for _ in range(16):
                    torch.matmul(a, b)
            elif phase == "copy":
                for _ in range(16):
                    dst.copy_(src)
            else:
                time.sleep(0.05)
            torch.cuda.synchronize()  # keeps the queue short, so the phase ends when its time does
            iters += 16 if phase != "idle" else 0
        windows.append({"phase": phase, "start_ns": start, "end_ns": time.monotonic_ns(), "iterations": iters})
    return windows


def _ncu_kernels(torch: Any) -> None:
    """A few kernels per phase inside NVTX ranges, for ncu to replay (no sampler: counters are shared)."""
    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    src = torch.randn(512 << 20, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    torch.matmul(a, a)
    dst.copy_(src)
    torch.cuda.synchronize()
    for name, op in (("gemm", lambda: torch.matmul(a, a)), ("copy", lambda: dst.copy_(src))):
        torch.cuda.nvtx.range_push(name)
        for _ in range(3):
            op()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    print("ncu kernels done: compare the ncu CSV with a normal run's table (see this file's docstring)")


def _verdicts(means: dict[str, dict[str, float]]) -> list[tuple[str, bool]]:
    def m(phase: str, field: str) -> float:
        return means.get(phase, {}).get(field, float("nan"))

    return [
        (f"tensor_active > {HIGH} in gemm ({m('gemm', TENSOR):.3f})", m("gemm", TENSOR) > HIGH),
        (f"tensor_active <= {HIGH} in copy ({m('copy', TENSOR):.3f}) and idle ({m('idle', TENSOR):.3f})",
         m("copy", TENSOR) <= HIGH and m("idle", TENSOR) <= HIGH),
        (f"dram_active > {HIGH} in copy ({m('copy', DRAM):.3f})", m("copy", DRAM) > HIGH),
        (f"tensor_active and dram_active < {LOW} idle ({m('idle', TENSOR):.3f}, {m('idle', DRAM):.3f})",
         m("idle", TENSOR) < LOW and m("idle", DRAM) < LOW),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=2.0)
    ap.add_argument("--interval-s", type=float, default=0.15, help="sampling period, >= 0.1 (GPM window)")
    ap.add_argument("--settle-s", type=float, default=0.35, help="left out at the start of each phase")
    ap.add_argument("--ncu", action="store_true", help="run a few NVTX-marked kernels for ncu instead")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed")
        return 2
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on the GPU machine")
        return 2
    if args.ncu:
        _ncu_kernels(torch)
        return 0
    from infersight.gpu.nvml_collector import NvmlCollector
    try:
        collector = NvmlCollector(gpm=True)
    except Exception as e:  # ImportError (no nvidia-ml-py) or an NVML error
        print(f"NVML unavailable: {type(e).__name__}: {e}")
        return 2
    device = torch.cuda.current_device()
    sampler = GpuSampler(collector, interval_s=max(0.1, args.interval_s), ring_size=1 << 20).start()
    print(sampler.status_line())
    try:
        windows = _work(torch, args.phase_s)
    finally:
        sampler.stop()
    samples = samples_frame(sampler.recent())
    # NVML's device order and torch's agree unless CUDA_VISIBLE_DEVICES remaps; take the GPU that NVML
    # index `device` names (set CUDA_DEVICE_ORDER=PCI_BUS_ID on multi-GPU hosts).
    samples = samples[samples["gpu"] == device]
    steps = pd.DataFrame({"step_id": range(len(windows)),
                          "start_ns": [w["start_ns"] + int(args.settle_s * 1e9) for w in windows],
                          "end_ns": [w["end_ns"] for w in windows]})
    avg = step_averages(samples, steps)
    means = {PHASES[int(r.step_id)]: {} for r in avg.itertuples()}
    for r in avg.itertuples():
        means[PHASES[int(r.step_id)]][str(r.field)] = float(r.mean)
    verdicts = _verdicts(means)
    t0 = windows[0]["start_ns"]
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "gpu_telemetry_check.json"
        out.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": torch.cuda.get_device_name(device),
            "args": vars(args), "status": sampler.status_line(), "errors": sampler.error_counts(),
            "phases": windows, "means": means,
            "verdicts": [{"check": c, "pass": ok} for c, ok in verdicts],
            "samples": [{**rec, "t_s": (rec["ts_ns"] - t0) / 1e9} for rec in samples.to_dict("records")],
        }, indent=1, default=str))
        print(f"wrote {out}")
    print(f"{'phase':6} {'tensor_active':>13} {'dram_active':>11} {'sm_active':>9} {'gr_engine':>9} {'iters':>6}")
    for w in windows:
        m = means.get(w["phase"], {})
        print(f"{w['phase']:6} {m.get(TENSOR, float('nan')):13.3f} {m.get(DRAM, float('nan')):11.3f} "
              f"{m.get(SM, float('nan')):9.3f} {m.get(GR, float('nan')):9.3f} {w['iterations']:6d}")
    for check, ok in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}  {check}")
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
