"""Confinement of the agent's poll: one source that raises costs that source's step of that poll, not
the agent. The agent's poll loop runs each source's step through PollGuard.run; an exception is
counted by source (infersight_agent_poll_failures_total{source}), logged with its traceback the first
time each (source, exception type) is seen, and the poll goes on with the next source.

Decoders of outside data turn what they cannot read into their own counted drops (the vLLM KV event
decoder's `malformed` counts, the ring screen's rejected records); this is the backstop for what
they do not foresee, so that no future decoder bug ends the process.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Iterator, TypeVar

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from infersight.exporters import catalogue as C

log = logging.getLogger("infersight.agent")
T = TypeVar("T")
#: The sources the agent's poll confines, each counted even at zero (a label set known in advance).
POLL_SOURCES = ("gpu", "rings", "tracing", "vllm_kv_events", "captures", "parquet")


class PollGuard:
    """Runs one source's step of a poll; its exceptions are counted and logged, never raised."""

    def __init__(self, sources: tuple[str, ...] = POLL_SOURCES) -> None:
        self.failures = dict.fromkeys(sources, 0)
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()  # the poll writes, a scrape (the HTTP thread) reads

    def run(self, source: str, step: Callable[..., T], *args: object) -> T | None:
        """step(*args), or None when it raised (then counted under `source`)."""
        try:
            return step(*args)
        except Exception as exc:  # noqa: BLE001 -- the confinement itself: one source, not the agent
            kind = (source, type(exc).__name__)
            with self._lock:
                self.failures[source] = self.failures.get(source, 0) + 1
                first = kind not in self._logged
                self._logged.add(kind)
            if first:  # once per kind: a source failing at every poll must not flood the log
                log.error('poll: %s failed (%s: %s); the agent goes on without it for this poll. Further '
                          '%s from it are counted in %s_total{source="%s"}, not logged', source, kind[1],
                          str(exc)[:200], kind[1], C.AGENT_POLL_FAILURES.name, source, exc_info=exc)
            return None

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.failures)

    def collector(self) -> Collector:
        return _PollGuardCollector(self)


class _PollGuardCollector(Collector):
    def __init__(self, guard: PollGuard) -> None:
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        spec = C.AGENT_POLL_FAILURES
        fam = CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        for source, n in sorted(self.guard.counts().items()):
            fam.add_metric([source], n)
        yield fam
