"""What repeated capture windows leave in the engine's memory: VmRSS over many flight-recorder windows.

Each window is the engine's own (probes.capture.StepCapture, asked through its control block as the agent
asks: 4 steps of TORCH_KERNELS, its trace exported and gzipped), around steps of a few hundred CPU ops.
Modes, each in a fresh process:

    current    StepCapture as shipped (release_results drops the profile's recorded events at once)
    kept       the same windows with the events left on the dropped profile (what StepCapture did before:
               the profile is a reference cycle, freed only by a full collection)
    collected  as `kept`, then gc.collect() after every window (the upstream report's workaround; timed)

Prints VmRSS every --every windows and the growth per window after the first --skip, one line per mode,
then a JSON object as the last line. All measured (/proc/self/status, time.perf_counter).

    python benchmarks/profiler_garbage.py --windows 100
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_mode(mode: str, windows: int, every: int) -> dict[str, object]:
    import torch

    from infersight.probes import capture as C
    from infersight.probes.control import CaptureTool, ControlBlock
    from infersight.runtime.stats import StepStats

    x, w = torch.randn(64, 256), torch.randn(256, 256)
    control = ControlBlock(f"infersight-garbage-{os.getpid()}", create=True)
    out = Path(tempfile.mkdtemp(prefix="infersight-garbage-"))
    cap = C.StepCapture(control, out)
    cap.warm_up()
    keep = mock.patch.object(C, "release_results", lambda profiler: None) if mode != "current" else None
    if keep is not None:
        keep.start()
    readings, gc_s, step = [], [], 0
    try:
        for i in range(windows):
            control.request(4, CaptureTool.TORCH_KERNELS)
            for _ in range(4):
                step += 1
                cap.on_step_begin(step)
                for _ in range(60):
                    torch.relu(x @ w)
                cap.on_step_end(StepStats(step_id=step, start_ns=0, end_ns=0))
            for f in out.glob("capture-*"):
                f.unlink()
            if mode == "collected":
                t = time.perf_counter()
                gc.collect()
                gc_s.append(time.perf_counter() - t)
            if i % every == 0 or i == windows - 1:
                readings.append((i, round(rss_mb(), 1)))
    finally:
        if keep is not None:
            keep.stop()
        control.close()
    return {"mode": mode, "rss_mb_by_window": readings,
            "gc_ms_median": round(sorted(gc_s)[len(gc_s) // 2] * 1e3, 2) if gc_s else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=100)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--skip", type=int, default=20, help="windows before the growth is read (start-up)")
    ap.add_argument("--mode", help=argparse.SUPPRESS)  # one mode in this process (the parent spawns each)
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(one_mode(args.mode, args.windows, args.every)))
        return 0
    results = []
    for mode in ("current", "kept", "collected"):
        res = subprocess.run([sys.executable, __file__, "--mode", mode, "--windows", str(args.windows), "--every",
                              str(args.every)], capture_output=True, text=True, check=True)
        r = json.loads(res.stdout.strip().splitlines()[-1])
        after = [(i, mb) for i, mb in r["rss_mb_by_window"] if i >= args.skip]
        r["growth_mb_per_window"] = (round((after[-1][1] - after[0][1]) / (after[-1][0] - after[0][0]), 3)
                                     if len(after) > 1 else None)
        results.append(r)
        gc_note = "" if r["gc_ms_median"] is None else f"  gc.collect() {r['gc_ms_median']} ms (median)"
        print(f"{mode:10s} RSS by window {r['rss_mb_by_window']}  growth {r['growth_mb_per_window']} MB/window{gc_note}")
    print(json.dumps({"measured": True, "windows": args.windows, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
