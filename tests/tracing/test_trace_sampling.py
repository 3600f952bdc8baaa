"""Sampling: the head ratio, the caller's decision, and the tail rules (slow and failed requests are
always kept, even at ratio 0); preemption and KV reload events on the spans that are kept."""
from __future__ import annotations

import random

from serve_fixtures import MODEL, Harness
from tracing_fixtures import AgentSide

from infersight.runtime import SamplingParams
from infersight.serve.config import ServeConfig
from infersight.tracing.sampling import decide, ratio_keeps


def test_ratio_is_a_deterministic_share_of_trace_ids() -> None:
    rng = random.Random(0)
    ids = [rng.getrandbits(128) for _ in range(20_000)]
    for ratio in (0.1, 0.5):
        kept = sum(ratio_keeps(t, ratio) for t in ids) / len(ids)
        assert abs(kept - ratio) < 0.02
        assert [ratio_keeps(t, ratio) for t in ids[:100]] == [ratio_keeps(t, ratio) for t in ids[:100]]
    assert all(ratio_keeps(t, 1.0) for t in ids[:100]) and not any(ratio_keeps(t, 0.0) for t in ids[:100])


def test_decision_rules() -> None:
    assert decide(1, 0.0, slow=True, failed=False, parent_sampled=None).rule == "slow"
    assert decide(1, 0.0, slow=False, failed=True, parent_sampled=False).keep  # failed beats the parent
    assert decide(1, 0.0, slow=False, failed=False, parent_sampled=True) == decide(
        1, 0.0, slow=False, failed=False, parent_sampled=True)
    assert decide(1, 0.0, slow=False, failed=False, parent_sampled=True).keep
    assert not decide(1, 1.0, slow=False, failed=False, parent_sampled=False).keep
    assert not decide(1, 0.0, slow=False, failed=False, parent_sampled=None).keep


def _engine_only(h: Harness) -> None:
    h.loop.stop()  # this test drives the engine itself, from this thread


def test_ratio_zero_still_keeps_slow_and_failed() -> None:
    with Harness(ServeConfig(model_name=MODEL)) as h:
        _engine_only(h)
        eng = h.engine
        short = [eng.add_request(f"short {i}", SamplingParams(max_tokens=3, ignore_eos=True)) for i in range(5)]
        slow = eng.add_request("the slow one", SamplingParams(max_tokens=60, ignore_eos=True))
        failed = eng.add_request("aborted", SamplingParams(max_tokens=60, ignore_eos=True))
        for _ in range(2):
            eng.step()
        eng.abort_request(failed)
        while eng.has_unfinished():
            eng.step()
        side = AgentSide(ratio=0.0, min_requests_for_p99=1)  # p99 over these rows: the slowest is slow
        side.poll(h)
    kept = {int(s.attributes["infersight.request_id"]): s for s in side.request_spans()}
    assert set(kept) == {slow, failed}, {k: s.attributes.get("infersight.sampling.rule") for k, s in kept.items()}
    assert kept[slow].attributes["infersight.sampling.rule"] == "slow" and kept[slow].attributes["infersight.slow_cause"]
    assert kept[failed].attributes["infersight.sampling.rule"] == "failed"
    assert not set(short) & set(kept)
    assert side.hook.sampled_out == len(short)
    # Only steps a kept request ran in become step spans.
    linked = {link.context.span_id for s in kept.values() for link in s.links}
    assert {s.context.span_id for s in side.named("engine.step")} == linked


def test_preemption_and_reload_events() -> None:
    """Four long requests in a KV pool for about one and a half: preempted (swapped or recomputed) and
    resumed; swapped ones reload their blocks. Each shows on its span as events."""
    with Harness(ServeConfig(model_name=MODEL), num_kv_blocks=48, cpu_offload_blocks=48) as h:
        _engine_only(h)
        prompt = "x" * 100
        for i in range(4):
            h.engine.add_request(prompt + str(i), SamplingParams(max_tokens=60, ignore_eos=True))
        while h.engine.has_unfinished():
            h.engine.step()
        side = AgentSide()
        side.poll(h)
    spans = side.request_spans()
    assert len(spans) == 4
    events = [e for s in spans for e in s.events]
    preempted = [e for e in events if e.name == "preempted"]
    assert preempted and any(e.name == "resumed" for e in events)
    assert sum(s.attributes["infersight.preemptions"] for s in spans) == len(preempted)
    assert {e.attributes["infersight.preemption.reason"] for e in preempted} <= {"swap", "recompute"}
    assert any(e.attributes["infersight.preemption.reason"] == "swap" for e in preempted)
    reloads = [e for e in events if e.name == "kv_reload"]
    assert reloads and all(e.attributes["infersight.kv.reloaded_blocks"] > 0 for e in reloads)
