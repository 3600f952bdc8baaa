"""The server's own counters (rejections by reason, malformed traceparents), served on its /metrics.

Names and help come from the catalogue (SERVE_METRICS); the registry is the server's own, never the
process-global default one.
"""
from __future__ import annotations

import threading
from typing import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from infersight.exporters import catalogue as C


class ServerCounters(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.traceparent_invalid = 0
        self.rejected: dict[str, int] = {}

    def reject(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def invalid_traceparent(self) -> None:
        with self._lock:
            self.traceparent_invalid += 1

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {"traceparent_invalid": self.traceparent_invalid, "rejected": dict(self.rejected)}

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        yield CounterMetricFamily(C.SERVER_TRACEPARENT_INVALID.name, C.SERVER_TRACEPARENT_INVALID.help,
                                  value=snap["traceparent_invalid"])
        fam = CounterMetricFamily(C.SERVER_REJECTED.name, C.SERVER_REJECTED.help, labels=list(C.SERVER_REJECTED.labels))
        for reason, n in sorted(snap["rejected"].items()):  # type: ignore[union-attr]
            fam.add_metric([reason], n)
        yield fam

    def registry(self) -> CollectorRegistry:
        reg = CollectorRegistry(auto_describe=True)
        reg.register(self)
        return reg
