"""StepSpanContexts: the step spans already sent, remembered so that later requests link to them.

A request's row comes when it finishes, seconds after its first steps; its span links each step it
ran in. A step span is sent once, on the first request that links it, and its context is kept for
the next ones: 20,000 of them at steady load (tens of seconds of steps). Kept as OpenTelemetry
SpanContext objects in an OrderedDict they cost ~365 B each (tracemalloc, issue 33: 7.3 MB for
20,000); here each is one Python int packing trace id, span id and the sampled flag, in a dict with
a deque for the order (126 B each, tracemalloc, 20,000 entries). Trace state is not kept: a step
span is the root of its own trace and has none.
"""
from __future__ import annotations

from collections import deque

from opentelemetry.trace import SpanContext, TraceFlags

_SPAN_BITS = 64


class StepSpanContexts:
    """step id -> the context of its sent span, the `limit` most recent (the oldest forgotten first)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self._packed: dict[int, int] = {}
        self._order: deque[int] = deque()

    def __len__(self) -> int:
        return len(self._packed)

    def get(self, step_id: int) -> SpanContext | None:
        packed = self._packed.get(step_id)
        if packed is None:
            return None
        sampled, ids = packed & 1, packed >> 1
        return SpanContext(ids >> _SPAN_BITS, ids & ((1 << _SPAN_BITS) - 1), is_remote=False,
                           trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT))

    def put(self, step_id: int, context: SpanContext) -> None:
        if step_id not in self._packed:
            self._order.append(step_id)
        self._packed[step_id] = ((context.trace_id << _SPAN_BITS | context.span_id) << 1) | int(context.trace_flags.sampled)
        while len(self._order) > self.limit:
            del self._packed[self._order.popleft()]
