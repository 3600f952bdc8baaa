"""StepCapture frees each window's recorded events when the window ends, without waiting for the garbage
collector: the dropped torch.profiler.profile is a reference cycle, and the autograd profile it holds (the
Kineto results: the memory) must not outlive the window. Automatic collection is off during the test, so
nothing but the capture's own release can free it."""
from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import torch

from infersight.probes.capture import StepCapture
from infersight.probes.control import CaptureState, CaptureTool, ControlBlock
from infersight.runtime.stats import StepStats


def _live_results() -> int:
    """Autograd profiles alive (tracked by the collector), each holding one window's events."""
    return sum(1 for o in gc.get_objects() if type(o) is torch.autograd.profiler.profile)


def test_a_window_s_events_are_freed_when_it_ends_not_at_the_next_full_collection(tmp_path: Path) -> None:
    control = ControlBlock(f"infersight-test-garbage-{os.getpid()}-{time.monotonic_ns()}", create=True)
    capture = StepCapture(control, tmp_path / "captures")
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        before = _live_results()
        for window in range(3):
            control.request(2, CaptureTool.TORCH_KERNELS)
            for step in (10 * window + 1, 10 * window + 2):
                capture.on_step_begin(step)
                assert _live_results() == before + 1  # the window's profile records
                torch.ones(8).sum()
                capture.on_step_end(StepStats(step_id=step, start_ns=0, end_ns=0))
            assert control.state is CaptureState.DONE and Path(control.path).stat().st_size > 0
            assert _live_results() == before  # freed at the window's end, with the collector off
    finally:
        if was_enabled:
            gc.enable()
        control.close()
