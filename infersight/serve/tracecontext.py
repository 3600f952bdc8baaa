"""The caller's W3C trace context (traceparent, tracestate), parsed by OpenTelemetry's propagator.

A request without a traceparent starts a new trace; so does one whose traceparent is malformed,
and that case is flagged (the server counts it and the span says so), never an error: tracing
must not turn a servable request away.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Mapping

from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


@dataclass(frozen=True)
class IncomingTrace:
    """trace_id: the caller's, or a new one. parent_span_id: the caller's span (0: none)."""

    trace_id: int
    parent_span_id: int = 0
    sampled: bool = False
    tracestate: str = ""
    invalid: bool = False  # a traceparent header was present but malformed


def new_trace_id() -> int:
    """128 random bits, never 0 (an all-zero trace id is invalid)."""
    return secrets.randbits(128) or 1


def extract(headers: Mapping[str, str]) -> IncomingTrace:
    """From request headers (case-insensitive mapping, e.g. Starlette's)."""
    traceparent = headers.get("traceparent")
    if traceparent is None:
        return IncomingTrace(new_trace_id())
    carrier = {"traceparent": traceparent}
    if headers.get("tracestate"):
        carrier["tracestate"] = headers["tracestate"]
    ctx = get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()
    if not ctx.is_valid:
        return IncomingTrace(new_trace_id(), invalid=True)
    return IncomingTrace(ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled, ctx.trace_state.to_header())
