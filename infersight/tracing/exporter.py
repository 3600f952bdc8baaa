"""The OpenTelemetry SDK side: span descriptions -> SDK spans -> bounded batching -> OTLP.

    SpanEmitter ──> BoundedBatchSpanProcessor ──> CountingExporter ──> OTLPSpanExporter
    (descriptions     (queue bounded in spans and      (counts accepted and      (http/protobuf by
     to SDK spans)     bytes; a span finding it full    failed spans; never       default, or grpc;
                       is dropped and counted)          raises)                   export_timeout_s)

The queue and its accounting are export_queue.py's; close() ends within the limits' shutdown
timeout and counts what it could not send.

Nothing here raises into the agent's ingest loop for a transport problem: an unreachable endpoint
costs a log line and a counted drop. The standard OTEL_EXPORTER_OTLP_* variables (headers, timeout,
compression, certificates, and the endpoint and protocol when none is given) are read by the
exporters themselves; OTEL_BSP_* size the batch processor when its arguments are left out.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Callable

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from infersight.tracing.export_queue import (
    BoundedBatchSpanProcessor, CountingExporter, ExportCounts, ExportLimits, close_pipeline_processor,
)
from infersight.tracing.identity import DEFAULT_SERVICE_NAME, IdentityConfig, identity_resource
from infersight.tracing.spans import RequestTrace, SpanDesc

log = logging.getLogger("infersight.tracing")
SCOPE = "infersight.tracing"
_KINDS = {"server": SpanKind.SERVER, "internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}


# -- ids --------------------------------------------------------------------------------------------
class PresetTraceIds(IdGenerator):
    """Random ids, except the next root span's trace id when preset: a request without a caller's
    traceparent still has a trace id (the engine's), and its span must carry that one. Likewise the
    next span id, when an engine's own request span is rebuilt here (tracing.span_join)."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._next_trace_id = 0
        self._next_span_id = 0

    def preset_trace_id(self, trace_id: int) -> None:
        self._next_trace_id = trace_id

    def preset_span_id(self, span_id: int) -> None:
        self._next_span_id = span_id

    def generate_span_id(self) -> int:
        span_id, self._next_span_id = self._next_span_id, 0
        return span_id or self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        trace_id, self._next_trace_id = self._next_trace_id, 0
        return trace_id or self._random.generate_trace_id()


# -- transport ----------------------------------------------------------------------------------------
def signal_endpoint(endpoint: str, signal: str) -> str:
    """An OTLP/HTTP base URL -> the signal's URL (http://h:4318 -> http://h:4318/v1/traces). A URL
    already ending in /v1/traces or /v1/metrics is taken as the base's signal URL."""
    base = endpoint.rstrip("/")
    for known in ("/v1/traces", "/v1/metrics"):
        base = base.removesuffix(known)
    return f"{base}/v1/{signal}"


def resolve_protocol(protocol: str | None, signal: str) -> str:
    chosen = (protocol or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
              or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if chosen not in ("http/protobuf", "grpc"):
        raise ValueError(f"OTLP protocol must be http/protobuf or grpc, got {chosen!r}")
    return chosen


def otlp_span_exporter(endpoint: str | None, protocol: str | None = None,
                       timeout_s: float | None = None) -> SpanExporter:
    """endpoint None: the OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT variables (or the SDK's default);
    timeout_s: one export request, retries included (None: the OTEL_EXPORTER_OTLP_*TIMEOUT variables)."""
    given = {"timeout": timeout_s} if timeout_s is not None else {}
    if resolve_protocol(protocol, "traces") == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            raise ValueError("OTLP over gRPC needs the opentelemetry-exporter-otlp-proto-grpc package") from None
        return GrpcExporter(endpoint=endpoint, **given) if endpoint else GrpcExporter(**given)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if endpoint:
        return OTLPSpanExporter(endpoint=signal_endpoint(endpoint, "traces"), **given)
    return OTLPSpanExporter(**given)


def default_resource(service_name: str = DEFAULT_SERVICE_NAME) -> Resource:
    """The resource from the environment (tracing.identity), service.name `infersight` unless
    OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES name one."""
    return identity_resource(IdentityConfig(service_name))


@dataclass
class SpanPipeline:
    """A tracer provider wired to one exporter, with its counts and id generator."""

    provider: TracerProvider
    ids: PresetTraceIds
    counts: ExportCounts
    processor: SpanProcessor | None = None  # the one processor, for spans forwarded as received
    limits: ExportLimits = field(default_factory=ExportLimits)

    @classmethod
    def build(cls, exporter: SpanExporter, *, batch: bool = True, max_queue_size: int | None = None,
              schedule_delay_millis: float | None = None, resource: Resource | None = None,
              limits: ExportLimits | None = None) -> "SpanPipeline":
        """batch=False exports each span as it ends (tests, with an in-memory exporter). limits: the
        queue's bounds and timeouts (None: ExportLimits.from_env, with max_queue_size and
        schedule_delay_millis when given)."""
        if limits is None:
            limits = ExportLimits.from_env(max_queue_spans=max_queue_size, schedule_delay_s=(
                schedule_delay_millis / 1000 if schedule_delay_millis is not None else None))
        ids, counts = PresetTraceIds(), ExportCounts()
        # Sampling is decided before a span is built (sampling.py); the SDK must not decide again.
        provider = TracerProvider(resource=resource or default_resource(), id_generator=ids, sampler=ALWAYS_ON,
                                  shutdown_on_exit=False)  # close() does it, with a deadline
        counting = CountingExporter(exporter, counts)
        processor = BoundedBatchSpanProcessor(counting, limits) if batch else SimpleSpanProcessor(counting)
        provider.add_span_processor(processor)
        return cls(provider, ids, counts, processor, limits)

    def forward(self, span: ReadableSpan) -> None:
        """Export a finished span as it is (one received from an engine: its own resource and scope)."""
        if self.processor is not None:
            self.processor.on_end(span)

    def flush(self, timeout_millis: int = 10_000) -> bool:
        """Send what is queued; False when that took longer than timeout_millis (the SDK's force_flush
        ignores its timeout, so it runs on a thread of its own that this one stops waiting for)."""
        done = threading.Event()

        def flush() -> None:
            self.provider.force_flush(timeout_millis)
            done.set()

        threading.Thread(target=flush, daemon=True, name="infersight-otlp-flush").start()
        return done.wait(timeout_millis / 1000)

    def shutdown(self) -> None:
        self.close()

    def close(self, timeout_s: float | None = None) -> int:
        """Send what is queued until timeout_s (None: the limits' shutdown_timeout_s) has passed, then
        stop; returns the spans left unsent (counted `shutdown`) and logs them when there are any."""
        timeout_s = self.limits.shutdown_timeout_s if timeout_s is None else max(0.0, timeout_s)
        if isinstance(self.processor, BoundedBatchSpanProcessor):
            unsent, took = close_pipeline_processor(self.processor, self.counts, timeout_s)
        else:
            unsent, took = self.counts.close(), 0.0
        self.provider.shutdown()  # the processor is shut already: returns at once
        if unsent:
            log.warning("OTLP shutdown: %d spans unsent after %.1f s (endpoint slow or unreachable); "
                        "%d exported in all", unsent, took, self.counts.exported)
        return unsent


# -- descriptions -> spans -------------------------------------------------------------------------------
class SpanEmitter:
    """Turns span descriptions into SDK spans with their recorded start and end times."""

    def __init__(self, pipeline: SpanPipeline) -> None:
        self.pipeline = pipeline
        self._tracer = pipeline.provider.get_tracer(SCOPE)
        self._lock = threading.Lock()  # the preset trace id must go to the span started right after it

    def step(self, desc: SpanDesc) -> SpanContext:
        """A step span, the root of its own (random) trace; returns its context for span links."""
        with self._lock:
            return self._emit(desc, Context(), [])

    def request(self, trace: RequestTrace, step_context: Callable[[int], SpanContext | None],
                span_id: int = 0) -> SpanContext:
        """The request span and its children, under the caller's span when it sent one. span_id:
        the request span's id when it must keep one (an engine's own span, joined), else 0."""
        links = []
        for step_id, tokens in trace.root.step_links:
            ctx = step_context(step_id)
            if ctx is not None:
                links.append(Link(ctx, {"infersight.step.tokens": tokens}))
        with self._lock:
            self.pipeline.ids.preset_span_id(span_id)
            if trace.parent_span_id:
                state = TraceState.from_header([trace.trace_state]) if trace.trace_state else None
                parent = SpanContext(trace.trace_id, trace.parent_span_id, is_remote=True,
                                     trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=state)
                context = trace_api.set_span_in_context(NonRecordingSpan(parent))
            else:
                self.pipeline.ids.preset_trace_id(trace.trace_id)
                context = Context()
            return self._emit(trace.root, context, links)

    def _emit(self, desc: SpanDesc, context: Context, links: list[Link]) -> SpanContext:
        span = self._tracer.start_span(desc.name, context=context, kind=_KINDS[desc.kind],
                                       attributes=desc.attributes, links=links, start_time=desc.start_ns)
        for event in desc.events:
            span.add_event(event.name, event.attributes, timestamp=event.wall_ns)
        if desc.error is not None:
            span.set_status(Status(StatusCode.ERROR, desc.error))
        inner = trace_api.set_span_in_context(span)
        for child in desc.children:
            self._emit(child, inner, [])
        span.end(end_time=desc.end_ns)
        return span.get_span_context()
