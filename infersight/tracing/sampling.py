"""Which requests get spans.

Spans are built after the request finished, so the decision can look at the outcome (tail rules)
as well as at the trace id (head rule):

1. slow (the agent attributed a slow_cause) or failed (finish reason abort/error): always kept;
2. a caller's traceparent decides for its trace (OpenTelemetry's parent-based default): its sampled
   flag keeps the request, its absence drops it, so a distributed trace is all-or-nothing;
3. otherwise the head ratio, decided on the trace id alone, so every service sampling the same
   trace id by ratio makes the same call.
"""
from __future__ import annotations

from dataclasses import dataclass

_TRACE_ID_BITS = 64  # the ratio looks at the low 64 bits: random in W3C trace ids (version 00 and 01)


def ratio_keeps(trace_id: int, ratio: float) -> bool:
    """Keep about `ratio` of trace ids, deterministically per id."""
    if ratio >= 1.0:
        return True
    if ratio <= 0.0:
        return False
    threshold = int(ratio * (1 << _TRACE_ID_BITS))
    return (trace_id & ((1 << _TRACE_ID_BITS) - 1)) < threshold


@dataclass(frozen=True)
class Decision:
    keep: bool
    rule: str  # slow | failed | parent | ratio (why; written as infersight.sampling.rule)


def decide(trace_id: int, ratio: float, *, slow: bool, failed: bool, parent_sampled: bool | None) -> Decision:
    """parent_sampled: the caller's sampled flag, or None when the request had no (valid) traceparent."""
    if failed:
        return Decision(True, "failed")
    if slow:
        return Decision(True, "slow")
    if parent_sampled is not None:
        return Decision(parent_sampled, "parent")
    return Decision(ratio_keeps(trace_id, ratio), "ratio")
