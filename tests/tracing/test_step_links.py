"""StepSpanContexts on tiny cases: a context comes back as it went in (128-bit trace id, 64-bit span
id, the sampled flag), the oldest step is forgotten first, a step put twice keeps one place."""
from __future__ import annotations

import pytest
from opentelemetry.trace import SpanContext, TraceFlags

from infersight.tracing.step_links import StepSpanContexts

TRACE = 0xFEDCBA9876543210_0123456789ABCDEF  # both halves' top bits set: nothing may be lost to a shift
SPAN = 0x8000000000000001


def _ctx(trace_id: int, span_id: int, sampled: bool) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=False,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT))


def test_a_context_comes_back_whole() -> None:
    links = StepSpanContexts(4)
    links.put(7, _ctx(TRACE, SPAN, True))
    links.put((3 << 48) | 7, _ctx(1, 2, False))  # a step of ring 3 (agent.rings.ingest's id shift)
    got = links.get(7)
    assert (got.trace_id, got.span_id, got.trace_flags.sampled, got.is_remote) == (TRACE, SPAN, True, False)
    other = links.get((3 << 48) | 7)
    assert (other.trace_id, other.span_id, other.trace_flags.sampled) == (1, 2, False)
    assert links.get(8) is None


def test_the_oldest_is_forgotten_first_and_a_second_put_keeps_one_place() -> None:
    links = StepSpanContexts(2)
    links.put(1, _ctx(1, 1, True))
    links.put(2, _ctx(2, 2, True))
    links.put(1, _ctx(9, 9, True))  # the same step again: replaced, not a second entry
    assert len(links) == 2 and links.get(1).trace_id == 9
    links.put(3, _ctx(3, 3, True))  # over the limit: step 1 (put first) goes
    assert [s for s in (1, 2, 3) if links.get(s) is not None] == [2, 3]


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be >= 1"):
        StepSpanContexts(0)
