"""What the first profiler start costs a capture window, with and without StepCapture.warm_up.

Each trial is a fresh process (the cost is once per process): it builds a control block and the
engine-side StepCapture, optionally warms the profiler up, then opens a flight-recorder window
(CaptureTool.TORCH_KERNELS) and times its start (on_step_begin: what the window's first step pays),
then a second window's. Prints one JSON line per trial and a summary (medians, measured):

    .venv/bin/python benchmarks/profiler_first_start.py [--trials 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, tempfile, time
import torch
from infersight.probes.capture import StepCapture
from infersight.probes.control import CaptureTool, ControlBlock
control = ControlBlock(f"infersight-bench-firststart-{os.getpid()}", create=True)
capture = StepCapture(control, tempfile.mkdtemp())
out = {"warm_up_s": capture.warm_up() if sys.argv[1] == "warm" else None}
for name, step in (("first_window_start_s", 1), ("second_window_start_s", 2)):
    control.request(1, CaptureTool.TORCH_KERNELS)
    t0 = time.perf_counter()
    capture.on_step_begin(step)
    out[name] = time.perf_counter() - t0
    torch.ones(8).sum()
    capture.close()
control.close()
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    rows: dict[str, list[dict]] = {"cold": [], "warm": []}
    for _ in range(args.trials):
        for mode in rows:  # interleaved: drift spreads over both
            with tempfile.TemporaryDirectory():
                run = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
            row = json.loads(run.stdout.strip().splitlines()[-1])
            rows[mode].append(row)
            print(json.dumps({"mode": mode, **row}))
    summary = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0] if rs[0][k] is not None}
               for mode, rs in rows.items()}
    print(json.dumps({"measured": "median over fresh processes, seconds (perf_counter)", "trials": args.trials,
                      **summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
