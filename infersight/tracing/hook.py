"""The agent's tracing hook: probe batches and finished request rows in, spans (and metrics) out.

    Agent.poll_once ── frames ──> TracingHook.ingest ──> TraceBuffers (steps, memberships, served)
    AgentState's ledger ── finished rows + their events ──> TracingHook.add_rows (its on_rows, via the agent)
                                        │
               sampling.decide ──> spans.request_trace ──> SpanEmitter ──> batch queue ──> OTLP

Rows come from AgentState, so they carry the agent's slow_cause and cost (engine_seconds, energy_j),
and a served request's row already waited there for its NETWORK record (and for its energy). A row then waits here until the steps
it ran in have been read (the step a request finishes in is written just after its FINISHED event),
at most STEP_WAIT_S. Step spans are exported once, the first time a kept request links to them.
With an OTLP receiver on (receiver.py), a ready row then waits in span_join.SpanJoin for the
engine's own request span and comes back to export_row joined with it (or alone, after the wait).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, TYPE_CHECKING

import pandas as pd
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanContext

from infersight.correlate.frames import EventFrames
from infersight.exporters import catalogue as C
from infersight.tracing.bounded import Evictions
from infersight.tracing.buffers import RING_SHIFT, TraceBuffers
from infersight.tracing.config import TracingConfig
from infersight.tracing.export_queue import ExportLimits
from infersight.tracing.identity import identity_resource
from infersight.tracing.exporter import ExportCounts, SpanEmitter, SpanPipeline, otlp_span_exporter
from infersight.tracing.metrics import GenAIServerMetrics, otlp_metric_reader
from infersight.tracing.span_join import DEFAULT_MAX_BYTES, DEFAULT_WAIT_S, EngineRequestSpan, SpanJoin, adopt, enrich
from infersight.tracing.spans import (DEFAULT_STEP_LINKS, NO_EVENTS, RequestEvents, RequestInputs, kernel_attributes,
                                      request_events, request_trace, step_span)
from infersight.tracing.step_links import StepSpanContexts

if TYPE_CHECKING:
    from infersight.exporters.aggregates import LabelledCounter

log = logging.getLogger("infersight.tracing")
STEP_WAIT_S = 1.0
MAX_STEP_SPANS = 20_000  # step span contexts remembered for links from later requests


@dataclass(frozen=True)
class JoinSettings:
    """The span join of a hook whose agent receives an engine's own spans: how long a row or a span
    waits for the other, the clock, and the join's share of the buffers (estimated bytes)."""

    wait_s: float = DEFAULT_WAIT_S
    clock: Callable[[], float] = time.monotonic
    max_bytes: int = DEFAULT_MAX_BYTES

    def build(self, hook: "TracingHook") -> SpanJoin:
        from infersight.tracing.vllm_spans import vllm_request_span

        return SpanJoin(hook.pipeline.forward, hook.export_row, vllm_request_span, self.wait_s, self.clock,
                        max_bytes=self.max_bytes, evictions=hook.buffers.evictions_counts)


class TracingHook:
    def __init__(self, pipeline: SpanPipeline, model: str, ratio: float = 1.0, export_content: bool = False,
                 metrics: GenAIServerMetrics | None = None, buffers: TraceBuffers | None = None,
                 kernels_for_request: Callable[[int], Mapping[str, Any] | None] | None = None,
                 gpu_for_step: Callable[[int, int], Mapping[str, float]] | None = None,
                 join: JoinSettings | None = None, mirror: Mapping[str, LabelledCounter] | None = None,
                 step_links: int = DEFAULT_STEP_LINKS) -> None:
        """kernels_for_request: request id -> its kernel summary from a capture, if one covered it.
        gpu_for_step: (start_ns, end_ns) -> GPU telemetry covering that step. join: set when the agent
        receives an engine's own request spans (tracing.receiver): ready rows then wait in span_join for
        their span and come back through export_row, joined with it or alone. mirror: the agent's
        counters of TRACING_METRICS names, kept in step with the pipeline's counts. step_links: how many
        steps a request span links at most (spans.step_links: its prefill steps, then its slowest)."""
        self.pipeline = pipeline
        self.emitter = SpanEmitter(pipeline)
        self.model, self.ratio, self.export_content, self.metrics = model, ratio, export_content, metrics
        self.buffers = buffers if buffers is not None else TraceBuffers()
        self.kept = self.sampled_out = 0
        self.step_links = step_links
        self._arrived: list[tuple[dict[str, Any], RequestEvents, float]] = []  # rows since the last process()
        self._anchors: dict[int, tuple[int, int]] = {}  # ring index -> (wall ns, monotonic ns)
        self._step_spans = StepSpanContexts(MAX_STEP_SPANS)
        self._mirror = dict(mirror or {})
        self.kernels_for_request, self.gpu_for_step = kernels_for_request, gpu_for_step
        self.span_join = join.build(self) if join is not None else None
        #: Set when the agent shuts down: rows are built until then; the ones left are counted unsent.
        self.build_deadline: float | None = None
        self.rows_unsent = 0

    @classmethod
    def from_config(cls, config: TracingConfig, model_name: str, counters: Mapping[str, LabelledCounter],
                    kernels_for_request: Callable[[int], Mapping[str, Any] | None] | None = None,
                    gpu_for_step: Callable[[int, int], Mapping[str, float]] | None = None,
                    resource: Resource | None = None) -> "TracingHook":
        """OTLP export as configured; model_name: the gen_ai.request.model of the spans; resource: who
        exports them and the OTLP metrics (tracing.identity; None: built from the environment). counters: the agent's; once TRACING_METRICS are merged into the
        catalogue, the agent's collector renders them from there, so the hook keeps those in step
        (until then, collector() serves them). The rows come in through add_rows, which the agent
        hands the rows' producer."""
        endpoint = config.otlp_endpoint or None  # "": the OTEL_EXPORTER_OTLP_* variables decide
        limits = export_limits(config)
        exporter = otlp_span_exporter(endpoint, config.otlp_protocol, timeout_s=limits.export_timeout_s)
        resource = resource or identity_resource()
        pipeline = SpanPipeline.build(exporter, limits=limits, resource=resource)
        metrics = (GenAIServerMetrics(otlp_metric_reader(endpoint, config.otlp_protocol, limits.export_timeout_s),
                                      resource) if config.otlp_metrics else None)
        join = (JoinSettings(config.otlp_join_wait_s, max_bytes=config.trace_buffer_bytes // 2)
                if config.receiver_on else None)
        return cls(pipeline, model_name, config.trace_sample_ratio, config.export_content, metrics,
                   TraceBuffers(config.trace_buffer_bytes // 2),  # the span join has the other half
                   kernels_for_request, gpu_for_step, join,
                   {s.name: counters[s.name] for s in C.TRACING_METRICS if s.name in counters}, config.step_links)

    # -- input ------------------------------------------------------------------------------------
    def add_rows(self, rows: pd.DataFrame, events: pd.DataFrame) -> None:
        """The rows' producer (AgentState's on_rows, through the agent) calls it under the state's lock,
        so it only queues. The next process() (in the same poll) builds what is ready; only the rows that must
        wait for their steps are kept, in buffers.rows, bounded in entries and bytes (what it forgets is
        counted)."""
        now = time.monotonic()
        by_request = request_events(events)
        for row in rows.to_dict("records"):
            self._arrived.append((row, by_request.get(int(row["request_id"]), NO_EVENTS), now))

    def ingest(self, frames: EventFrames, ring_index: int, anchor: tuple[int, int]) -> None:
        """One probe batch of ring `ring_index` (after AgentState ingested it); builds what is ready."""
        self._anchors[ring_index] = anchor
        try:
            self.buffers.absorb(frames, ring_index)
        except Exception:  # noqa: BLE001 -- tracing must never stop the agent's ingest loop
            log.exception("tracing could not read a probe batch; its spans may lack steps or server timing")
        self.process()

    # -- output -----------------------------------------------------------------------------------
    def process(self, force: bool = False) -> None:
        """Build spans of rows whose steps have all been read (or waited STEP_WAIT_S; force: all)."""
        now, rows = time.monotonic(), self.buffers.rows
        arrived, self._arrived = self._arrived, []
        # The waiting rows (oldest first), then this poll's: a row is kept only if it is not ready.
        todo = [(rid, entry, True) for rid, entry in rows.items()]
        todo += [(int(entry[0]["request_id"]), entry, False) for entry in arrived]
        for rid, (row, events, added), kept in todo:
            ring = rid >> RING_SHIFT
            if self.build_deadline is not None and time.monotonic() > self.build_deadline:
                if not kept:  # shutting down: what is left is counted in close()
                    self._arrived.append((row, events, added))
                continue
            if force or now - added >= STEP_WAIT_S or self.buffers.step_end.get(ring, -1) >= int(row["finish_ns"]):
                if kept:
                    rows.pop(rid)
                if self.span_join is not None:
                    self.span_join.add_row(row, events, ring)
                else:
                    self.export_row(row, events, ring)
            elif not kept:
                self.buffers.add_row(row, events, added)
        if self.span_join is not None and (self.build_deadline is None or time.monotonic() <= self.build_deadline):
            self.span_join.process(force)
        self._sync_mirror()

    def export_row(self, row: dict[str, Any], events: RequestEvents, ring: int,
                   engine: EngineRequestSpan | None = None) -> None:
        """Build (sample, export) one finished row's spans. engine: the engine's own request span for
        this row (span_join), whose ids the request span keeps."""
        served, spec, reloads, steps = self.buffers.take(int(row["request_id"]))
        if engine is not None:
            row, served = adopt(engine, row, served)
        operation = served.operation if served is not None else "text_completion"
        try:
            if self.metrics is not None:
                self.metrics.record(row, operation, self.model)
            wall, mono = self._anchors.get(ring, (0, 0))

            def to_wall(ns: int) -> int:
                return ns - mono + wall

            trace = request_trace(RequestInputs(row, events, served, spec, reloads, steps, self._step_ns(steps),
                                                self.step_links), to_wall, self.model, self.ratio, self.export_content)
            if engine is not None:
                enrich(engine, trace)
            if not trace.decision.keep:
                self.sampled_out += 1
                return
            kernels = self.kernels_for_request(int(row["request_id"])) if self.kernels_for_request else None
            if kernels:  # a capture covered some of this request's steps
                trace.root.attributes.update(kernel_attributes(kernels))
            self.emitter.request(trace, lambda step_id: self._step_context(step_id, to_wall),
                                 engine.span_id if engine is not None else 0)
            self.kept += 1
        except Exception:  # noqa: BLE001 -- a bad row must not stop the agent's ingest loop
            log.exception("could not build spans for request %s", row.get("request_id"))

    def _step_ns(self, steps: list[tuple[int, int]]) -> dict[int, int]:
        """The buffered steps' durations (ns), which rank a request's steps for its links; none needed
        when it links them all."""
        if len(steps) <= self.step_links:
            return {}
        out = {}
        for step_id, _ in steps:
            step = self.buffers.step(step_id)
            if step is not None:
                out[step_id] = int(step["end_ns"]) - int(step["start_ns"])
        return out

    def _step_context(self, step_id: int, to_wall: Any) -> SpanContext | None:
        ctx = self._step_spans.get(step_id)
        if ctx is None:
            step = self.buffers.step(step_id)
            if step is None:  # older than the step window, or its record was lost
                return None
            gpu = self.gpu_for_step(int(step["start_ns"]), int(step["end_ns"])) if self.gpu_for_step else None
            ctx = self.emitter.step(step_span(step, to_wall, gpu))
            self._step_spans.put(step_id, ctx)
        return ctx

    def flush(self, timeout_millis: int = 10_000) -> None:
        """Build everything waiting and push it out (tests; shutdown)."""
        self.process(force=True)
        self.pipeline.flush(timeout_millis)
        if self.metrics is not None:
            self.metrics.flush(timeout_millis)
        self._sync_mirror()

    def close(self, timeout_s: float | None = None) -> int:
        """Build everything waiting, send it until the deadline (timeout_s; None: the pipeline's
        shutdown_timeout_s), stop. Returns the spans left unsent (counted and logged)."""
        deadline = time.monotonic() + (self.pipeline.limits.shutdown_timeout_s if timeout_s is None else timeout_s)
        if self.build_deadline is None:  # building gets half the time, sending the rest
            self.build_deadline = time.monotonic() + (deadline - time.monotonic()) / 2
        self.process(force=True)
        self.rows_unsent += len(self.buffers.rows) + len(self._arrived) + (
            sum(self.span_join.pending[1:]) if self.span_join is not None else 0)
        if self.rows_unsent:
            log.warning("OTLP shutdown: %d finished requests had no spans built before the deadline", self.rows_unsent)
        self.buffers.rows.clear()
        self._arrived = []
        # The metrics reader gets a share of what is left: its exporter has the same timeout.
        share = 0.5 if self.metrics is not None else 1.0
        unsent = self.pipeline.close(max(0.0, (deadline - time.monotonic()) * share))
        if self.metrics is not None:
            self.metrics.shutdown(max(0.0, deadline - time.monotonic()))
        self._sync_mirror()
        return unsent

    def export_stats(self) -> dict[str, object]:
        """The export path's accounting, for the agent's summary (`sources.otlp_export`)."""
        counts = self.pipeline.counts
        with counts.lock:
            queued, exported, queued_bytes = counts.queued, counts.exported, counts.queued_bytes
        return {"spans_queued": queued, "spans_exported": exported, "dropped": counts.dropped(),
                "unsent_at_shutdown": counts.shutdown, "requests_unbuilt_at_shutdown": self.rows_unsent,
                "in_queue_or_flight": counts.in_queue_or_flight(),
                "queue_bytes": queued_bytes, "buffer_evictions": self.buffers.evictions(),
                "limits": {"max_queue_spans": self.pipeline.limits.max_queue_spans,
                           "max_queue_bytes": self.pipeline.limits.max_queue_bytes,
                           "export_timeout_s": self.pipeline.limits.export_timeout_s,
                           "shutdown_timeout_s": self.pipeline.limits.shutdown_timeout_s}}

    # -- accounting -------------------------------------------------------------------------------
    def _sync_mirror(self) -> None:
        counts = self.pipeline.counts
        if C.OTLP_SPANS_EXPORTED.name in self._mirror:
            self._mirror[C.OTLP_SPANS_EXPORTED.name].values[()] = float(counts.exported)
        if C.OTLP_SPANS_DROPPED.name in self._mirror:
            for reason, n in counts.dropped().items():
                self._mirror[C.OTLP_SPANS_DROPPED.name].values[(reason,)] = float(n)

    def collector(self) -> Collector:
        return _TracingCollector(self.pipeline.counts, self.buffers.evictions_counts)


def export_limits(config: TracingConfig) -> ExportLimits:
    """The export limits the config asks for (unset ones: the OTEL_* variables, else defaults)."""
    return ExportLimits.from_env(max_queue_spans=config.otlp_queue_spans, max_queue_bytes=config.otlp_queue_bytes,
                                 export_timeout_s=config.otlp_export_timeout_s,
                                 shutdown_timeout_s=config.otlp_shutdown_timeout_s)


class _TracingCollector(Collector):
    """Serves TRACING_METRICS on the agent's /metrics while they are not in the catalogue."""

    def __init__(self, counts: ExportCounts, evictions: Evictions) -> None:
        self.counts, self.evictions = counts, evictions

    def collect(self) -> Iterator[Metric]:
        merged = {spec.name for spec in C.CATALOGUE}
        if C.OTLP_SPANS_EXPORTED.name not in merged:
            yield CounterMetricFamily(C.OTLP_SPANS_EXPORTED.name, C.OTLP_SPANS_EXPORTED.help,
                                      value=self.counts.exported)
        if C.OTLP_SPANS_DROPPED.name not in merged:
            fam = CounterMetricFamily(C.OTLP_SPANS_DROPPED.name, C.OTLP_SPANS_DROPPED.help,
                                      labels=list(C.OTLP_SPANS_DROPPED.labels))
            for reason, n in sorted(self.counts.dropped().items()):
                fam.add_metric([reason], n)
            yield fam
        fam = CounterMetricFamily(C.TRACING_BUFFER_EVICTED.name, C.TRACING_BUFFER_EVICTED.help,
                                  labels=list(C.TRACING_BUFFER_EVICTED.labels))
        for (table, reason), n in sorted(self.evictions.snapshot().items()):
            fam.add_metric([table, reason], n)
        yield fam
