"""Which steps a request span links (spans.step_links: its prefill steps, then its slowest, at most N) and
the request's events as its spans read them (spans.request_events), on tiny cases; then on a real engine's
ring, the links the hook exported against a choice made by hand from the same raw frames."""
from __future__ import annotations

import asyncio

import pandas as pd
import pytest
from serve_fixtures import MODEL, Harness
from tracing_fixtures import AgentSide

from infersight.serve.config import ServeConfig
from infersight.tracing.spans import NO_EVENTS, RequestEvents, request_events, step_links

STEPS = [(1, 5), (2, 1), (3, 1), (4, 1), (5, 1)]  # (step id, tokens fed): step 1 is the prefill
STEP_NS = {1: 10, 2: 50, 3: 20, 4: 40, 5: 30}


def test_the_prefill_step_first_then_the_slowest_in_step_order() -> None:
    assert step_links(STEPS, STEP_NS, 3) == [(1, 5), (2, 1), (4, 1)]
    assert step_links(STEPS, STEP_NS, 1) == [(1, 5)]  # the prefill outranks any decode step


def test_a_limit_at_or_above_the_steps_links_them_all_and_zero_links_none() -> None:
    assert step_links(STEPS, {}, 5) == STEPS and step_links(STEPS, {}, 128) == STEPS
    assert step_links(STEPS, STEP_NS, 0) == []


def test_steps_no_longer_buffered_come_last() -> None:
    assert step_links(STEPS, {3: 20, 5: 30}, 3) == [(1, 5), (3, 1), (5, 1)]


def _event(rid: int, kind: str, ts: int, end: int = -1, v0: int = 0, v1: int = 0, reason: str = "") -> dict:
    return {"ts_ns": ts, "end_ns": end, "request_id": rid, "trace_id": "0" * 32, "task": "chat", "event": kind,
            "reason": reason, "value0": v0, "value1": v1}


def test_request_events_keep_chunks_and_marks_in_time_order_and_skip_the_rest() -> None:
    frame = pd.DataFrame([
        _event(7, "ARRIVED", 100), _event(7, "PREFILL_CHUNK", 300, 350, 16, 16),
        _event(7, "PREFILL_CHUNK", 200, 260, 16, 0), _event(7, "PREEMPTED", 400, reason="recompute"),
        _event(7, "RESUMED", 500), _event(8, "FIRST_TOKEN", 900), _event(9, "PREFILL_CHUNK", 50, 80, 3, 0)])
    got = request_events(frame)
    assert got == {7: RequestEvents(chunks=((200, 260, 16, 0), (300, 350, 16, 16)),
                                    marks=(("PREEMPTED", 400, "recompute"), ("RESUMED", 500, ""))),
                   9: RequestEvents(chunks=((50, 80, 3, 0),))}
    assert 8 not in got and request_events(frame.iloc[:0]) == {}
    assert got[7].estimated_bytes() > got[9].estimated_bytes() > NO_EVENTS.estimated_bytes() > 0


@pytest.mark.parametrize("limit", [4, 8])
def test_the_exported_links_are_the_ones_chosen_by_hand_from_the_ring(limit: int) -> None:
    """A real engine: one request of 24 tokens beside two short ones. From the same frames the hook reads, by
    hand: each request's steps and tokens (batch rows), the steps' durations (step records), then its prefill
    steps and the slowest others up to `limit`. The step spans its request span links must be exactly those."""
    with Harness(ServeConfig(model_name=MODEL)) as h:
        async def go() -> None:
            async with h.client() as c:
                for tokens in (24, 3, 5):
                    r = await c.post("/v1/completions", json={"prompt": f"hello {tokens}", "max_tokens": tokens,
                                                              "ignore_eos": True})
                    assert r.status_code == 200
        asyncio.run(go())
        h.wait_idle()
        frames = h.read_frames()
        side = AgentSide()
        side.hook.step_links = limit
        side.state.ingest(frames)
        side.hook.ingest(frames, 0, h.consumer.anchor)  # type: ignore[union-attr]
        side.hook.flush()
    took = {int(r.step_id): int(r.end_ns) - int(r.start_ns) for r in frames.steps.itertuples()}
    members: dict[int, list[tuple[int, int]]] = {}
    for r in frames.batch.itertuples():
        members.setdefault(int(r.request_id), []).append((int(r.step_id), int(r.num_tokens)))
    step_ids = {s.context.span_id: s.attributes["infersight.step.id"] for s in side.named("engine.step")}
    long_seen = False
    for span in side.request_spans():
        mine = members[int(span.attributes["infersight.request_id"])]
        prefill = sorted(s for s, n in mine if n > 1)
        decode = sorted((s for s, n in mine if n <= 1), key=lambda s: took[s], reverse=True)
        expected = sorted((prefill + decode)[:limit])
        linked = sorted(step_ids[link.context.span_id] for link in span.links)
        assert linked == expected, span.attributes["infersight.request_id"]
        assert span.attributes["infersight.steps"] == len(mine)
        assert span.attributes.get("infersight.step_links_dropped", 0) == len(mine) - len(expected)
        long_seen |= len(mine) > limit
    assert long_seen  # the 24-token request had more steps than the limit
    # Only linked steps become spans: none is exported that no request links.
    assert set(step_ids) == {link.context.span_id for s in side.request_spans() for link in s.links}
