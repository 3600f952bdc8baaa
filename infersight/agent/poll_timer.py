"""How long each of the agent's polls takes: its own cost, as a histogram on /metrics
(infersight_agent_poll_duration_seconds). A poll reads every ring and source once and folds what it
had; under constant load its time must stay flat, and one that grows says the agent is falling behind
(the soak in benchmarks/agent_memory_soak.py reads it per sample)."""
from __future__ import annotations

import bisect
import threading
from typing import Iterator

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from infersight.exporters import catalogue as C


class PollTimer:
    """Cumulative bucket counts and sum of poll durations (seconds), on the catalogue's buckets."""

    def __init__(self) -> None:
        self.bounds: tuple[float, ...] = C.AGENT_POLL_DURATION.buckets or ()
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket, the last is +Inf
        self.total_s = 0.0
        self._lock = threading.Lock()  # the poll writes, a scrape (the HTTP thread) reads

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
            self.total_s += seconds

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """([(le, cumulative count)...] ending with +Inf, sum)."""
        with self._lock:
            counts, total = list(self.counts), self.total_s
        cumulative, running = [], 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], counts):
            running += n
            cumulative.append((bound, running))
        return cumulative, total

    def collector(self) -> Collector:
        return _PollTimerCollector(self)


class _PollTimerCollector(Collector):
    def __init__(self, timer: PollTimer) -> None:
        self.timer = timer

    def collect(self) -> Iterator[Metric]:
        spec = C.AGENT_POLL_DURATION
        buckets, total = self.timer.snapshot()
        yield HistogramMetricFamily(spec.name, spec.help, buckets=buckets, sum_value=total)
