"""The server's own counters (rejections by reason, malformed traceparents, requests the engine failed,
probe records not written, draft-model fallbacks), served on its /metrics.

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
    """Thread-safe: the handlers (asyncio loop) and the engine thread both count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.traceparent_invalid = 0
        self.rejected: dict[str, int] = {}
        self.failed: dict[str, int] = {"request": 0, "step": 0}
        self.probe_writes_failed = 0
        self.fallbacks: dict[str, int] = {"request": 0, "step": 0}

    def reject(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def request_failed(self, scope: str, n: int = 1) -> None:
        """n accepted requests failed by the engine; scope: request (confined) or step (all in flight)."""
        with self._lock:
            self.failed[scope] = self.failed.get(scope, 0) + n

    def probe_write_failed(self) -> None:
        with self._lock:
            self.probe_writes_failed += 1

    def draft_fallbacks(self, requests: int, steps: int) -> None:
        """The engine's running totals (runtime.speculative.verify.DraftFallbacks): requests and steps that
        went on without speculation because the draft model failed."""
        with self._lock:
            self.fallbacks = {"request": requests, "step": steps}

    def invalid_traceparent(self) -> None:
        with self._lock:
            self.traceparent_invalid += 1

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {"traceparent_invalid": self.traceparent_invalid, "rejected": dict(self.rejected),
                    "failed": dict(self.failed), "probe_writes_failed": self.probe_writes_failed,
                    "draft_fallbacks": dict(self.fallbacks)}

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        yield CounterMetricFamily(C.SERVER_TRACEPARENT_INVALID.name, C.SERVER_TRACEPARENT_INVALID.help,
                                  value=snap["traceparent_invalid"])
        fam = CounterMetricFamily(C.SERVER_REJECTED.name, C.SERVER_REJECTED.help, labels=list(C.SERVER_REJECTED.labels))
        for reason, n in sorted(snap["rejected"].items()):  # type: ignore[union-attr]
            fam.add_metric([reason], n)
        yield fam
        fam = CounterMetricFamily(C.SERVER_REQUESTS_FAILED.name, C.SERVER_REQUESTS_FAILED.help,
                                  labels=list(C.SERVER_REQUESTS_FAILED.labels))
        for scope, n in sorted(snap["failed"].items()):  # type: ignore[union-attr]
            fam.add_metric([scope], n)
        yield fam
        yield CounterMetricFamily(C.SERVER_PROBE_WRITES_FAILED.name, C.SERVER_PROBE_WRITES_FAILED.help,
                                  value=snap["probe_writes_failed"])
        fam = CounterMetricFamily(C.SERVER_DRAFT_FALLBACKS.name, C.SERVER_DRAFT_FALLBACKS.help,
                                  labels=list(C.SERVER_DRAFT_FALLBACKS.labels))
        for scope, n in sorted(snap["draft_fallbacks"].items()):  # type: ignore[union-attr]
            fam.add_metric([scope], n)
        yield fam

    def registry(self) -> CollectorRegistry:
        reg = CollectorRegistry(auto_describe=True)
        reg.register(self)
        return reg
