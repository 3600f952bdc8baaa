"""probes.heap_trim through StepCapture: a full capture's freed profiler events stay resident unless the
heap is trimmed; after a window that grew the resident set past TRIM_ABOVE_BYTES the capture trims it;
a small window does not pay for a trim. RSS read from /proc/self/status (VmRSS), not from the module."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import infersight.probes.capture as capture_module
from infersight.probes.capture import StepCapture
from infersight.probes.control import CaptureTool, ControlBlock
from infersight.probes.heap_trim import trim_heap
from infersight.runtime import Engine, EngineConfig, SamplingParams
from testkit import one_torch_thread

MB = 1 << 20


def vm_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


@pytest.fixture
def decoding():
    with one_torch_thread():
        engine = Engine(EngineConfig(model="tiny-moe", max_num_seqs=8, max_model_len=512))
        for i in range(8):
            engine.add_request([10 + i] * 64, SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
        for _ in range(10):
            engine.step()
        yield engine


def capture(engine: Engine, cap: StepCapture, control: ControlBlock, steps: int) -> None:
    control.request(steps, CaptureTool.TORCH)  # a full capture (shapes recorded), as a trigger's
    cap.on_step_begin(0)
    for _ in range(steps):
        engine.step()
    cap.close()


def test_a_big_capture_is_trimmed_back_and_a_small_one_is_not(tmp_path: Path, decoding, monkeypatch) -> None:
    control = ControlBlock(f"infersight-test-trim-{os.getpid()}-{time.monotonic_ns()}", create=True)
    cap = StepCapture(control, tmp_path)
    try:
        trim_heap()
        before = vm_rss()
        monkeypatch.setattr(capture_module, "TRIM_ABOVE_BYTES", 1 << 50)  # trimming off: the pages stay
        capture(decoding, cap, control, 20)
        kept = vm_rss() - before
        assert kept > 100 * MB and cap.trims == 0, kept / MB
        assert trim_heap() and vm_rss() - before < 32 * MB  # they were free, only not returned
        monkeypatch.undo()
        before = vm_rss()
        capture(decoding, cap, control, 20)
        assert cap.trims == 1 and vm_rss() - before < 32 * MB, (vm_rss() - before) / MB
        capture(decoding, cap, control, 1)  # a one-step window grows the heap little: no trim
        assert cap.trims == 1
    finally:
        cap.close()
        control.close()


def test_small_windows_that_add_up_are_trimmed_once_they_pass_the_threshold(tmp_path: Path, decoding,
                                                                            monkeypatch) -> None:
    """Beside `serve` each recorder window left 5-12 MB of free heap resident and none crossed a per-window
    threshold (BENCHMARKS.md): the threshold counts from the last trim. Resident sizes scripted (MB): 100
    before the first window; windows end at 110 (no trim), 120 (20 above 100: trim, 101 after it), 112 (11
    above 101: no trim), 118 (17 above 101: trim, 102 after it); -1 marks the end of the script."""
    readings = iter([100, 110, 120, 101, 112, 118, 102, -1])
    monkeypatch.setattr(capture_module, "resident_bytes", lambda: next(readings) * MB)
    monkeypatch.setattr(capture_module, "TRIM_ABOVE_BYTES", 16 * MB)
    trimmed_after = []
    monkeypatch.setattr(capture_module, "trim_heap", lambda: trimmed_after.append(window) or True)
    control = ControlBlock(f"infersight-test-trim-floor-{os.getpid()}-{time.monotonic_ns()}", create=True)
    cap = StepCapture(control, tmp_path)
    try:
        for window in range(4):
            capture(decoding, cap, control, 1)
        assert trimmed_after == [1, 3] and cap.trims == 2
        assert next(readings) == -1  # each reading was taken once: none skipped, none extra
    finally:
        cap.close()
        control.close()
