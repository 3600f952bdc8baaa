"""The bounded export queue: the SDK's BatchSpanProcessor, limited in spans and in bytes, every loss
counted by reason, and a shutdown that gives up at a deadline instead of waiting on a dead endpoint.

    on_end ──> admit? (spans < max_queue_spans and bytes < max_queue_bytes) ──> SDK batch queue
                 │ no: dropped, reason queue_full / queue_bytes                     │ worker thread
                 ▼                                                                  ▼
               counted                                      CountingExporter ──> OTLP transport
                                                            (exported / export_failed)

Spans still queued or in flight when shutdown's deadline passes are counted `shutdown`, so that
    built == exported + queue_full + queue_bytes + export_failed + shutdown + (still queued)
holds at every moment (the last term is zero once the pipeline is closed).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

log = logging.getLogger("infersight.tracing")
DROP_REASONS = ("queue_full", "queue_bytes", "export_failed", "shutdown")
FAILURE_LOG_INTERVAL_S = 10.0
# What a span costs in the agent's memory beyond its strings, measured with tracemalloc on SDK spans
# (1.45, CPython 3.11): ~2.7 KB for a bare span, ~140 B per short attribute, ~590 B per event with two
# attributes; 500 spans of 30 attributes, 100 events and 2 links took 68 KB each (estimate: 75 KB).
SPAN_OVERHEAD = 2_800
ITEM_OVERHEAD = 130
EVENT_OVERHEAD = 350
LINK_OVERHEAD = 600


@dataclass(frozen=True)
class ExportLimits:
    """How much the export path may hold and how long it may wait.

    max_queue_spans, max_queue_bytes: the batch queue's bounds (bytes as estimated by span_bytes);
    export_timeout_s: one export request, retries included (the OTLP exporters' own timeout);
    schedule_delay_s: how often the worker sends a partial batch; shutdown_timeout_s: the whole
    flush at shutdown, after which what is left is counted `shutdown` and abandoned.
    """

    max_queue_spans: int = 2048
    max_queue_bytes: int = 16 << 20
    max_export_batch_size: int = 512
    export_timeout_s: float = 2.0
    schedule_delay_s: float = 5.0  # the SDK's default (OTEL_BSP_SCHEDULE_DELAY)
    shutdown_timeout_s: float = 3.0

    def __post_init__(self) -> None:
        if self.max_queue_spans < 1 or self.max_queue_bytes < 1 or self.max_export_batch_size < 1:
            raise ValueError("OTLP queue limits must be >= 1")
        if not 0 < self.export_timeout_s <= 60 or not 0 < self.shutdown_timeout_s <= 60:
            raise ValueError("OTLP export and shutdown timeouts must be in (0, 60] s")
        if not 0 < self.schedule_delay_s <= 60:
            raise ValueError("the OTLP schedule delay must be in (0, 60] s")

    @classmethod
    def from_env(cls, **given: Any) -> "ExportLimits":
        """The given values, else the standard OTEL_BSP_* / OTEL_EXPORTER_OTLP_*TIMEOUT variables, else
        our defaults (an export timeout of 2 s, not the SDK's 10 s: shutdown must end within 5 s)."""
        values = {k: v for k, v in given.items() if v is not None}
        env = {"max_queue_spans": ("OTEL_BSP_MAX_QUEUE_SIZE", int, 1),
               "max_export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", int, 1),
               "schedule_delay_s": ("OTEL_BSP_SCHEDULE_DELAY", float, 1e-3),
               "export_timeout_s": ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", float, 1.0)}
        for name, (var, kind, scale) in env.items():
            if name not in values and os.environ.get(var):
                try:
                    values[name] = kind(float(os.environ[var]) * scale) if kind is float else kind(os.environ[var])
                except ValueError:
                    log.warning("ignoring %s=%r (not a number)", var, os.environ[var])
        limits = cls(**values)
        if limits.max_export_batch_size > limits.max_queue_spans:
            limits = cls(**{**values, "max_export_batch_size": limits.max_queue_spans})
        return limits


def _value_bytes(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_value_bytes(v) + 16 for v in value)
    return 8


def attributes_bytes(attributes: Any) -> int:
    """The estimated memory of an attribute mapping: keys, values, per-item overhead."""
    if not attributes:
        return 0
    return sum(len(k) + _value_bytes(v) + ITEM_OVERHEAD for k, v in attributes.items())


def span_bytes(span: ReadableSpan) -> int:
    """The estimated memory a queued span holds (see SPAN_OVERHEAD); the same span, the same number."""
    size = SPAN_OVERHEAD + len(span.name) + attributes_bytes(span.attributes)
    for event in span.events:
        size += EVENT_OVERHEAD + len(event.name) + attributes_bytes(event.attributes)
    for link in span.links:
        size += LINK_OVERHEAD + attributes_bytes(link.attributes)
    return size


def spans_bytes(spans: Iterable[ReadableSpan]) -> int:
    return sum(span_bytes(s) for s in spans)


@dataclass
class ExportCounts:
    """Span accounting, shared by the processor (on the agent's thread) and the exporter (on the
    processor's worker thread); see the module docstring for the invariant."""

    queued: int = 0         # admitted to the batch queue
    handed: int = 0         # taken off the queue by the worker, handed to the transport
    exported: int = 0
    queue_full: int = 0
    queue_bytes: int = 0    # dropped: the queue's byte limit
    export_failed: int = 0
    shutdown: int = 0       # still queued or in flight when shutdown's deadline passed
    queued_bytes: int = 0   # estimated bytes in the queue now
    closed: bool = False    # after shutdown: late export results are no longer counted
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def admit(self, capacity: int, size: int = 0, max_bytes: int | None = None) -> bool:
        """Room in a queue of `capacity` spans (and `max_bytes`) for a span of `size` bytes? Counts
        it as queued, or as dropped (queue_full, queue_bytes)."""
        with self.lock:
            if self.closed:
                self.shutdown += 1
                return False
            if self.queued - self.handed >= capacity:
                self.queue_full += 1
                return False
            if max_bytes is not None and self.queued_bytes + size > max_bytes:
                self.queue_bytes += 1
                return False
            self.queued += 1
            self.queued_bytes += size
            return True

    def in_queue_or_flight(self) -> int:
        with self.lock:
            return self.queued - self.exported - self.export_failed - self.shutdown

    def dropped(self) -> dict[str, int]:
        with self.lock:
            return {"queue_full": self.queue_full, "queue_bytes": self.queue_bytes,
                    "export_failed": self.export_failed, "shutdown": self.shutdown}

    def close(self) -> int:
        """Shutdown's deadline passed: what is still queued or in flight is counted `shutdown`."""
        with self.lock:
            if self.closed:
                return 0
            self.closed = True
            left = self.queued - self.exported - self.export_failed
            self.shutdown += left
            return left


class CountingExporter(SpanExporter):
    """Wraps the transport: counts what it accepted and what it did not, logs failures, never raises
    (the OTLP exporters retry transient errors themselves, within their timeout, before giving up)."""

    def __init__(self, inner: SpanExporter, counts: ExportCounts) -> None:
        self.inner = inner
        self.counts = counts
        self._logged_at = -1e9

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        n, size = len(spans), spans_bytes(spans)
        with self.counts.lock:
            self.counts.handed += n
            self.counts.queued_bytes = max(0, self.counts.queued_bytes - size)
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # noqa: BLE001 -- a transport bug must not take the worker thread down
            log.warning("OTLP span export raised %s: %s; %d spans dropped", type(exc).__name__, exc, n)
            result = SpanExportResult.FAILURE
        with self.counts.lock:
            if self.counts.closed:  # already counted as `shutdown`
                return result
            if result is SpanExportResult.SUCCESS:
                self.counts.exported += n
            else:
                self.counts.export_failed += n
        if result is not SpanExportResult.SUCCESS:
            now = time.monotonic()
            if now - self._logged_at >= FAILURE_LOG_INTERVAL_S:  # an outage costs a line every 10 s, not per batch
                self._logged_at = now
                log.warning("OTLP span export failed; %d spans dropped (endpoint unreachable or refusing; "
                            "%d export_failed so far)", n, self.counts.export_failed)
        return result

    def shutdown(self) -> None:
        try:
            self.inner.shutdown()  # the OTLP exporters stop retrying at once
        except Exception as exc:  # noqa: BLE001
            log.warning("OTLP span exporter shutdown raised %s: %s", type(exc).__name__, exc)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


class BoundedBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's batch processor with its queue bounded in spans and bytes, overflow counted (the SDK
    would silently drop the oldest queued span instead), and a shutdown with a deadline."""

    def __init__(self, exporter: CountingExporter, limits: ExportLimits) -> None:
        self.limits = limits
        self.capacity = limits.max_queue_spans
        super().__init__(exporter, limits.max_queue_spans, limits.schedule_delay_s * 1000,
                         limits.max_export_batch_size, limits.export_timeout_s * 1000)
        self.counts = exporter.counts

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        if self.counts.admit(self.capacity, span_bytes(span), self.limits.max_queue_bytes):
            super().on_end(span)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        """Send what is queued until the deadline (the worker sends, this thread only waits), then
        stop: an export still in flight is left to its own timeout on the (daemon) worker thread."""
        timeout = self.limits.shutdown_timeout_s * 1000 if timeout_millis is None else timeout_millis
        batch = getattr(self, "_batch_processor", None)  # the SDK's BatchProcessor (1.3x): it takes a timeout
        if batch is not None and hasattr(batch, "shutdown"):
            batch.shutdown(max(0, int(timeout)))
        else:  # an SDK without it: at least do not wait longer than the deadline
            worker = threading.Thread(target=super().shutdown, daemon=True, name="infersight-otlp-shutdown")
            worker.start()
            worker.join(max(0.0, timeout / 1000))


def close_pipeline_processor(processor: BoundedBatchSpanProcessor, counts: ExportCounts,
                             timeout_s: float) -> tuple[int, float]:
    """Shut the processor down within timeout_s; (spans left unsent, seconds taken)."""
    start = time.monotonic()
    processor.shutdown(timeout_s * 1000)
    return counts.close(), time.monotonic() - start
