"""The export path never raises into the agent and counts what it loses: a full queue, a failing or
unreachable endpoint; the counts reach Prometheus. And the opt-in OTLP metrics use the GenAI
conventions' names and advised buckets."""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from serve_fixtures import MODEL, free_port

from infersight.tracing import metrics as M
from infersight.tracing.exporter import SpanEmitter, SpanPipeline, signal_endpoint
from infersight.tracing.hook import TracingHook
from infersight.tracing.metrics import GenAIServerMetrics
from infersight.tracing.spans import SpanDesc


class Blocking(SpanExporter):
    """Holds the processor's worker inside export until released: the queue behind it fills up."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(10)
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


class Raising(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise ConnectionError("collector on fire")


def emit(pipeline: SpanPipeline, n: int) -> None:
    emitter = SpanEmitter(pipeline)
    for i in range(n):
        emitter.step(SpanDesc(f"s{i}", 1_000 + i, 2_000 + i))


def test_full_queue_drops_are_counted() -> None:
    blocking = Blocking()
    pipe = SpanPipeline.build(blocking, max_queue_size=4, schedule_delay_millis=10)
    emit(pipe, 1)
    assert blocking.entered.wait(5)  # the worker holds span 0 in export; the queue is empty again
    emit(pipe, 10)                   # 4 fit, 6 find it full
    blocking.release.set()
    pipe.flush()
    c = pipe.counts
    assert (c.queue_full, c.exported, c.export_failed) == (6, 5, 0)
    assert len(blocking.spans) == 5
    pipe.shutdown()


def test_a_raising_exporter_is_counted_not_raised() -> None:
    pipe = SpanPipeline.build(Raising(), batch=False)
    emit(pipe, 3)  # would raise here if the wrapper let it through
    assert pipe.counts.export_failed == 3 and pipe.counts.exported == 0


def test_unreachable_endpoint_is_counted_not_raised() -> None:
    port = free_port()  # nothing listens there
    pipe = SpanPipeline.build(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=1),
                              schedule_delay_millis=10)
    emit(pipe, 3)
    pipe.flush(5_000)
    assert pipe.counts.export_failed == 3
    pipe.shutdown()


def test_drop_counters_on_the_agents_metrics() -> None:
    pipe = SpanPipeline.build(Raising(), batch=False)
    emit(pipe, 2)
    registry = CollectorRegistry()
    registry.register(TracingHook(pipe, MODEL).collector())
    text = generate_latest(registry).decode()
    assert 'infersight_otlp_spans_dropped_total{reason="export_failed"} 2.0' in text
    assert 'infersight_otlp_spans_dropped_total{reason="queue_full"} 0.0' in text
    assert "infersight_otlp_spans_exported_total 0.0" in text


def test_signal_endpoints() -> None:
    assert signal_endpoint("http://h:4318", "traces") == "http://h:4318/v1/traces"
    assert signal_endpoint("http://h:4318/", "metrics") == "http://h:4318/v1/metrics"
    assert signal_endpoint("http://h:4318/v1/traces", "metrics") == "http://h:4318/v1/metrics"


def test_genai_server_metrics_use_the_advised_buckets() -> None:
    reader = InMemoryMetricReader()
    m = GenAIServerMetrics(reader)
    ok = {"finish_reason": "length", "e2e_s": 0.3, "ttft_s": 0.05, "itl_mean_s": 0.02, "output_tokens": 10}
    m.record(ok, "chat", MODEL)
    m.record({**ok, "finish_reason": "abort", "ttft_s": np.nan}, "chat", MODEL)
    data = reader.get_metrics_data()
    found = {metric.name: metric for rm in data.resource_metrics for sm in rm.scope_metrics for metric in sm.metrics}
    assert set(found) == {M.TTFT, M.TPOT, M.DURATION}
    for name, bounds in ((M.TTFT, M.TTFT_BUCKETS), (M.TPOT, M.TPOT_BUCKETS), (M.DURATION, M.DURATION_BUCKETS)):
        points = found[name].data.data_points
        assert all(tuple(p.explicit_bounds) == bounds for p in points), name
        assert found[name].unit == "s"
    durations = {p.attributes.get("error.type"): p.count for p in found[M.DURATION].data.data_points}
    assert durations == {None: 1, "abort": 1}  # failed requests only in the duration, with error.type
    (ttft,) = found[M.TTFT].data.data_points
    assert ttft.count == 1 and ttft.attributes["gen_ai.operation.name"] == "chat"
    assert ttft.attributes["gen_ai.provider.name"] == "infersight" and ttft.attributes["gen_ai.request.model"] == MODEL
    m.shutdown()


def test_memory_pipeline_roundtrip() -> None:
    memory = InMemorySpanExporter()
    pipe = SpanPipeline.build(memory, batch=False)
    emit(pipe, 2)
    assert [s.name for s in memory.get_finished_spans()] == ["s0", "s1"] and pipe.counts.exported == 2


def test_the_queue_byte_limit_drops_and_counts() -> None:
    """Equal spans, a byte limit worth three of them: of ten queued behind a held export, three fit."""
    from infersight.tracing.export_queue import ExportLimits, span_bytes

    blocking = Blocking()
    memory = InMemorySpanExporter()
    emit(SpanPipeline.build(memory, batch=False), 1)  # the same span emit() will build below
    size = span_bytes(memory.get_finished_spans()[0])
    limits = ExportLimits(max_queue_spans=100, max_queue_bytes=3 * size + size // 2, schedule_delay_s=0.01,
                          max_export_batch_size=100)
    pipe = SpanPipeline.build(blocking, limits=limits)
    emit(pipe, 1)
    assert blocking.entered.wait(5)  # the worker holds span 0; its bytes left the queue with it
    emit(pipe, 10)
    c = pipe.counts
    assert (c.queue_bytes, c.queue_full, c.queued) == (7, 0, 4)
    blocking.release.set()
    assert pipe.flush(5_000)
    assert (c.exported, c.queued_bytes) == (4, 0)
    assert pipe.close() == 0


def test_close_gives_up_at_its_deadline_and_counts_the_unsent() -> None:
    """An export that never returns: close(0.5) returns within a second, every queued span counted."""
    import time

    from infersight.tracing.export_queue import ExportLimits

    blocking = Blocking()  # never released: a collector that accepted and never answered
    pipe = SpanPipeline.build(blocking, limits=ExportLimits(schedule_delay_s=0.01, max_export_batch_size=1))
    emit(pipe, 1)
    assert blocking.entered.wait(5)
    emit(pipe, 5)
    t0 = time.monotonic()
    unsent = pipe.close(0.5)
    took = time.monotonic() - t0
    assert unsent == 6 and took < 1.0  # the one in flight and the five behind it
    assert pipe.counts.dropped() == {"queue_full": 0, "queue_bytes": 0, "export_failed": 0, "shutdown": 6}
    emit(pipe, 1)  # after close: refused and counted, never queued
    assert pipe.counts.dropped()["shutdown"] == 7
    blocking.release.set()


def test_bounded_table_evicts_oldest_by_entries_then_bytes() -> None:
    from infersight.tracing.bounded import BoundedTable, Evictions

    ev = Evictions()
    t: BoundedTable[int, list[int]] = BoundedTable("members", ev, max_entries=3, max_bytes=1_000)
    for key in range(5):
        t.put(key, [key], 100)
    assert list(t) == [2, 3, 4] and t.bytes == 300 and ev.snapshot() == {("members", "entries"): 2}
    t.append(3, 33, 800)  # 1,100 bytes now: the oldest (2) goes, 3 and 4 stay
    assert list(t) == [3, 4] and t.bytes == 1_000 and t.get(3) == [3, 33]
    assert ev.snapshot() == {("members", "entries"): 2, ("members", "bytes"): 1}
    assert t.pop(3) == [3, 33] and t.bytes == 100
