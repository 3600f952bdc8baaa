"""`infersight analyze` on a CPU-only Kineto trace (a vLLM CPU worker's, or torch.profiler without CUDA):
a breakdown of CPU ops, not an error."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function


def test_a_cpu_only_trace_is_analysed(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("step"):
                a = torch.randn(64, 64)
                (a @ a).sum()
    prof.export_chrome_trace(str(path))
    # The expected count comes from the raw file: every aten::mm op the profiler wrote.
    raw = json.loads(path.read_text())
    mm_calls = sum(1 for e in raw["traceEvents"] if e.get("name") == "aten::mm" and e.get("ph") == "X")
    assert mm_calls == 3
    proc = subprocess.run([sys.executable, "-m", "infersight", "analyze", str(path), "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["device_kind"] == "cpu"
    top = {k["name"]: k["count"] for k in report["top_kernels"]}
    assert top["aten::mm"] == mm_calls
