"""Capture a torch.profiler (Kineto) trace of a few decode steps with probes on, and check that
the engine's range names (step, forward.*, layer.N.*) appear next to the CUDA kernels.

    python benchmarks/profile_capture.py OUT_DIR [--model tiny-moe] [--steps 5]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import shutil
from pathlib import Path

import torch

from infersight.probes.config import ProbeConfig
from infersight.probes.observer import make_observer
from infersight.runtime import Engine, EngineConfig, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    observer = make_observer(ProbeConfig(events=False))
    engine = Engine(EngineConfig(model=args.model, device="cuda", dtype=args.dtype, max_num_seqs=8), observer)
    for i in range(8):
        engine.add_request([65 + i] * (32 + 8 * i), SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    engine.step()
    engine.step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                                record_shapes=True) as prof:
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
    raw = args.out / "trace.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(args.out / f"kineto_{args.model}.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    events = json.load(gzip.open(args.out / f"kineto_{args.model}.json.gz"))["traceEvents"]
    cats = collections.Counter(e.get("cat") for e in events)
    names = collections.Counter(e["name"] for e in events if e.get("cat") == "user_annotation")
    print("categories:", dict(cats))
    print("ranges:", dict(sorted(names.items())[:20]))
    print("kernels:", sum(1 for e in events if e.get("cat") == "kernel"))


if __name__ == "__main__":
    main()
