"""GpuSampler: polls one collector on its own daemon thread and keeps what it read.

The thread owns the collector; readers take copies. pause_profiling() asks the collector (on the
sampler's thread, at once) to stop reading profiler-grade counters while a capture runs: the GPU's
performance monitors serve one client at a time, so GPM or DCGM profiling fields would make Nsight
Compute / Systems fail or perturb them (DCGM's own advice is `dcgmi profile --pause`). The only lock is the sampler's own, held for
a deque append or a dict copy, never across a poll, so a slow NVML call or a hung scrape never
blocks a reader, and the engine's locks are never touched. A poll that raises is counted per
collector and logged (first failure of a streak at WARNING, the rest at DEBUG, recovery at INFO);
the loop keeps its schedule.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable

from infersight.gpu.samples import GpuCollector, GpuSample

log = logging.getLogger(__name__)
SeriesKey = tuple[int, str, str, str]  # (gpu, uuid, instance, field)


class GpuSampler:
    """Bounded ring of recent samples plus the latest value per series, filled every interval_s."""

    def __init__(self, collector: GpuCollector, interval_s: float = 1.0, ring_size: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0 or ring_size < 1:
            raise ValueError("interval_s must be > 0 and ring_size >= 1")
        self.collector = collector
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._ring: deque[GpuSample] = deque(maxlen=ring_size)
        self._latest: dict[SeriesKey, GpuSample] = {}
        self._errors: dict[str, int] = {collector.name: 0}
        self._polls = 0
        self._last_error = ""
        self._failing = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False  # the collector is closed
        self._pause_wanted = False
        self._pause_applied = False
        self.pause_note = ""

    # -- the polling side ---------------------------------------------------------------------
    def pause_profiling(self, paused: bool) -> None:
        """Pause (or resume) the collector's profiler-grade counters; applied on the sampler's
        thread right away (or at the next poll_once when no thread runs)."""
        self._pause_wanted = paused
        self._wake.set()

    @property
    def profiling_paused(self) -> bool:
        return self._pause_applied

    def _apply_pause(self) -> None:
        wanted = self._pause_wanted
        if wanted == self._pause_applied:
            return
        setter = getattr(self.collector, "set_profiling_paused", None)
        if setter is None:
            self.pause_note = (f"{self.collector.name} cannot pause profiling metrics from here; for ncu / nsys "
                               "run `dcgmi profile --pause` (and --resume) around captures")
            log.info("GPU telemetry: %s", self.pause_note)
        else:
            try:
                setter(wanted)
                self.pause_note = ""
            except Exception as e:  # the capture goes on; say why the counters may conflict
                self.pause_note = f"could not {'pause' if wanted else 'resume'} profiling metrics: {e}"
                log.warning("GPU telemetry: %s", self.pause_note)
        self._pause_applied = wanted
        log.info("GPU telemetry: profiling metrics %s", "paused for a capture" if wanted else "resumed")

    def poll_once(self) -> int:
        """One poll, on the caller's thread (the loop calls this; tests call it directly).
        Returns how many samples were stored; a failed poll stores none and is counted."""
        self._apply_pause()
        try:
            samples = self.collector.poll()
        except Exception as e:  # any collector failure is data, not a crash
            with self._lock:
                self._errors[self.collector.name] = self._errors.get(self.collector.name, 0) + 1
                self._last_error = f"{type(e).__name__}: {e}"
            log.log(logging.DEBUG if self._failing else logging.WARNING,
                    "GPU telemetry: %s poll failed: %s", self.collector.name, e)
            self._failing = True
            return 0
        if self._failing:
            log.info("GPU telemetry: %s recovered", self.collector.name)
            self._failing = False
        with self._lock:
            self._polls += 1
            self._ring.extend(samples)
            for s in samples:
                self._latest[(s.gpu, s.uuid, s.instance, s.field)] = s
        return len(samples)

    def _run(self) -> None:
        deadline = self._clock()
        while not self._stop.is_set():
            if self._wake.is_set():  # woken between polls: apply a pause now, poll on schedule
                self._wake.clear()
                self._apply_pause()
                now = self._clock()
                if now < deadline:
                    self._wait(deadline - now)
                    continue
            self.poll_once()
            # Fixed-rate schedule; after an overrun (a hung scrape) skip the missed ticks.
            deadline += self.interval_s
            now = self._clock()
            if deadline < now:
                deadline = now + self.interval_s - (now - deadline) % self.interval_s
            self._wait(max(0.0, deadline - now))

    def _wait(self, seconds: float) -> None:
        """Sleep until the next poll, a stop, or a pause request (stop() sets _wake too)."""
        self._wake.wait(seconds)

    def start(self) -> "GpuSampler":
        self._stopped = False
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"gpu-sampler-{self.collector.name}",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0, final_poll: bool = False) -> None:
        """Stop the thread (waits up to timeout_s for an in-flight poll) and close the collector.
        A poll still running after the wait keeps its collector open: closing NVML or DCGM under
        a live call is worse than leaking a handle at exit (the thread is a daemon). final_poll:
        take one last reading first (so counters such as energy cover up to now); a sampler
        already stopped takes none."""
        if self._stopped:
            return
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("GPU telemetry: %s poll still running after %.1f s; collector left open",
                            self.collector.name, timeout_s)
                return
        if final_poll:
            self.poll_once()
        self._stopped = True
        self.collector.close()

    # -- the reading side ---------------------------------------------------------------------
    def recent(self) -> list[GpuSample]:
        """The ring's samples, oldest first (a copy)."""
        with self._lock:
            return list(self._ring)

    def latest(self) -> list[GpuSample]:
        """The newest sample of every series seen so far (a copy)."""
        with self._lock:
            return list(self._latest.values())

    def error_counts(self) -> dict[str, int]:
        """Failed polls per collector name (a copy)."""
        with self._lock:
            return dict(self._errors)

    def status_line(self) -> str:
        with self._lock:
            polls, errors, last = self._polls, sum(self._errors.values()), self._last_error
        tail = f", {errors} failed (last: {last})" if errors else ""
        return f"{self.collector.status_line()}; {polls} polls every {self.interval_s:g} s{tail}"
