"""HostPauses: the engine process's stalls in Python's cyclic garbage collector, timed by gc.callbacks.

A collection stops every thread of the process while it walks the tracked objects: a full one over an
engine's heap (model objects, request state, the tokenizer) took 129-172 ms here (BENCHMARKS.md, "The
start-up heap"), and every request in flight waits that long. Nothing else in the process sees it:
the step that held it just looks slow, or the gap between two steps long.

The callbacks fire on whichever thread triggered the collection, not necessarily the engine thread,
which is the ring's one producer. So they only time the collection and append it to a bounded deque
(one append, atomic under the GIL, as popleft is); the observer takes the pauses on the engine thread
at the end of each step, and before a FINISHED record, so that a request's own pauses precede its
end in the ring. Collections shorter than `min_ns` are not kept: the young generation is collected
hundreds of times a second in ~0.1 ms each and would flood the ring with nothing a request feels
(ProbeConfig.host_pause_min_s, 5 ms by default).
"""
from __future__ import annotations

import gc
import time
from collections import deque
from typing import Callable

#: Pauses held between two takes; past it the oldest go (counted in `missed`): a pause long before a
#: step is the least likely to matter to a request in flight.
HOST_PAUSES_HELD = 1024


class HostPauses:
    """Times the process's garbage collections from construction to close()."""

    def __init__(self, min_s: float, held: int = HOST_PAUSES_HELD,
                 clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        if min_s < 0:
            raise ValueError(f"a host pause's minimum must be >= 0 s, got {min_s}")
        self.min_ns = round(min_s * 1e9)
        self._clock_ns = clock_ns
        self._held: deque[tuple[int, int, int, int]] = deque(maxlen=held)
        self._missed = 0     # pauses pushed out of the deque since the last take
        self._start_ns = 0   # collections never overlap within a process: one start at a time
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start_ns = self._clock_ns()
            return
        end = self._clock_ns()
        if end - self._start_ns < self.min_ns:
            return
        held = self._held
        if len(held) == held.maxlen:
            self._missed += 1
        held.append((self._start_ns, end, int(info.get("collected", 0)), int(info.get("generation", 0))))

    def __bool__(self) -> bool:
        """Whether a pause waits to be taken (one length read: the engine asks at every step)."""
        return bool(self._held)

    def take(self) -> tuple[list[tuple[int, int, int, int]], int]:
        """The pauses held, oldest first, as (start_ns, end_ns, collected, generation), and how many
        were pushed out before them since the last take."""
        held, out = self._held, []
        while held:
            out.append(held.popleft())
        missed, self._missed = self._missed, 0
        return out, missed

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
