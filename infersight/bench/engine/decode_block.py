"""The decode block cross-check of `bench runtime`: the timed decode steps on one wall clock.

The headline decode_step_ms is the median of per-step wall times (perf_counter around each
engine.step()). With async scheduling (runtime.engine.async_steps) a step is launched before the one
before it is read back, so one call waits for the device work of another and the steps are not
fenced apart; a per-step figure then rests on the calls splitting the time fairly. The block figure
needs no such assumption: perf_counter around the whole block of the N timed steps, the device
synchronized at both ends (CUDA; nothing to wait for on the CPU), divided by N. Both are measured.

    sync  t0 |step 2|step 3| ... |step N+1| sync  t1      block_step_ms = (t1 - t0) / N
              <-t2->  <-t3->       <-tN+1->               decode_step_ms = median(t2 .. tN+1)

The block also holds the loop's own time between the steps and the closing sync (the device work
still queued when the last step returns), so block_step_ms >= mean(t) and the ratio
block_over_step = block_step_ms / decode_step_ms is 1 only when the median is the mean and nothing
is left in flight.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from infersight.bench.engine.timing import sync


@dataclass
class DecodeBlockTiming:
    """All measured, in ms: the block of `steps` timed decode steps (see the module docstring)."""

    steps: int
    block_ms: float           # the whole block's wall clock, device synchronized at both ends
    block_step_ms: float      # block_ms / steps
    step_ms_median: float     # the headline (decode_step_ms): median of the same steps' own wall times
    step_ms_min: float
    step_ms_max: float
    block_over_step: float    # block_step_ms / step_ms_median
    said: str = ("decode_step_ms (the headline) is the median of the per-step wall times; block_step_ms is "
                 "the wall clock of the whole block of steps over their number, the device synchronized at "
                 "both ends: both measured")


class DecodeBlockClock:
    """Times the steps `first` .. `end - 1` of a decode loop as one block: call `enter(i)` before
    step i's own timing starts and `leave(i)` after it stops."""

    def __init__(self, device: str, first: int, end: int) -> None:
        if end - first < 1:
            raise ValueError(f"a decode block needs at least one step, got steps {first} to {end - 1}")
        self.device, self.first, self.last = device, first, end - 1
        self._t0: float | None = None
        self.seconds: float | None = None

    def enter(self, i: int) -> None:
        if i == self.first:
            sync(self.device)  # nothing of the steps before the block is left to finish inside it
            self._t0 = time.perf_counter()

    def leave(self, i: int) -> None:
        if i == self.last:
            assert self._t0 is not None, "leave() of the block's last step before enter() of its first"
            sync(self.device)  # the device work the block's steps queued, finished inside it
            self.seconds = time.perf_counter() - self._t0

    def timing(self, step_seconds: list[float]) -> DecodeBlockTiming:
        """The block against its steps' own wall times (seconds, one per step of the block)."""
        if self.seconds is None or len(step_seconds) != self.last - self.first + 1:
            raise ValueError(f"the block of {self.last - self.first + 1} steps was not timed whole "
                             f"({len(step_seconds)} step times)")
        n, median = len(step_seconds), statistics.median(step_seconds)
        return DecodeBlockTiming(n, round(1e3 * self.seconds, 3), round(1e3 * self.seconds / n, 4),
                                 round(1e3 * median, 4), round(1e3 * min(step_seconds), 4),
                                 round(1e3 * max(step_seconds), 4), round(self.seconds / n / median, 4))
