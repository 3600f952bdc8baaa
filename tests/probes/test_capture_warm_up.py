"""StepCapture.warm_up: the profiler started and stopped once before serving, recording nothing and
leaving the control block as it was; a no-op while a window records."""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from infersight.probes.capture import StepCapture
from infersight.probes.control import CaptureState, CaptureTool, ControlBlock


def _control(tag: str) -> ControlBlock:
    return ControlBlock(f"infersight-test-warmup-{tag}-{os.getpid()}-{time.monotonic_ns()}", create=True)


def test_warm_up_records_nothing_and_a_window_after_it_writes_its_trace(tmp_path: Path) -> None:
    control = _control("idle")
    out = tmp_path / "captures"
    capture = StepCapture(control, out)
    try:
        state, seq = control.state, control.request_seq
        assert capture.warm_up() > 0
        assert not torch.autograd.profiler._is_profiler_enabled  # stopped again
        assert not out.exists()  # no trace, no directory
        assert (control.state, control.request_seq) == (state, seq)
        control.request(1, CaptureTool.TORCH_KERNELS)  # a flight-recorder window afterwards works as before
        capture.on_step_begin(3)
        torch.ones(4).sum()
        capture.close()
        assert control.state is CaptureState.DONE and Path(control.path).stat().st_size > 0
    finally:
        control.close()


def test_warm_up_is_a_no_op_inside_a_window(tmp_path: Path) -> None:
    control = _control("window")
    capture = StepCapture(control, tmp_path / "captures")
    try:
        control.request(2, CaptureTool.TORCH)
        capture.on_step_begin(5)
        assert torch.autograd.profiler._is_profiler_enabled
        assert capture.warm_up() == 0.0
        assert torch.autograd.profiler._is_profiler_enabled  # the window's profiler still records
        capture.close()
        assert control.state is CaptureState.DONE
    finally:
        control.close()
