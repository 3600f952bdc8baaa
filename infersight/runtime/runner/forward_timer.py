"""Timing one forward pass without making the host wait for the device.

On the CPU a forward has finished when the call returns: the wall clock is its time. On a GPU
the call returns once the kernels are queued, so the wall clock would time the launch; two CUDA
events around it time the device work instead. They are read at the end of the step, when
sampling (an `.item()`) has already waited for the logits, so reading them adds no sync; a step
that sampled nothing (only non-final prefill chunks) may still be running, and reports -1.
"""
from __future__ import annotations

import time

import torch


class ForwardTimer:
    """start() / stop() around a forward, elapsed_ns() once the step is over."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        # Two events made once and re-recorded by every forward: creating and destroying a pair
        # per step costs the host more than recording them.
        self._pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if self.cuda else None
        self._events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        self._start_ns = self._stop_ns = 0

    def start(self) -> None:
        if self._pair is not None:
            self._events = self._pair
            self._events[0].record()
        else:
            self._start_ns = time.monotonic_ns()

    def stop(self) -> None:
        if self._events is not None:
            self._events[1].record()
        else:
            self._stop_ns = time.monotonic_ns()

    def elapsed_ns(self) -> int:
        """The forward's time in ns; -1 if its device work is not known to have finished."""
        if self._events is None:
            return self._stop_ns - self._start_ns
        begin, end = self._events
        if not end.query():
            return -1
        return round(begin.elapsed_time(end) * 1e6)  # elapsed_time is in ms
