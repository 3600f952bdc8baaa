"""A failure in the draft model is confined: the request it failed for (or, when the draft forward
itself raises, that one step) decodes without speculation, and the rest of the batch speculates on.

The expected tokens come from a second engine WITHOUT a draft, fed the same requests: a greedy
request's tokens are the target's argmax either way, and a sampled one's come from the batched
sampler, whose noise depends only on the request's seed and position, so a request that falls back
to plain decoding must produce exactly what the plain engine produces. Faults are injected into the
draft runner for one chosen request (NaN logits: torch.multinomial refuses them) or one step."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from testkit import one_torch_thread

from infersight.runtime import Engine, EngineConfig, ModelConfig, SamplingParams
from infersight.serve.metrics import ServerCounters

TARGET = ModelConfig("df-moe", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, n_experts=4, top_k=2,
                     max_seq_len=96)
DRAFT = ModelConfig("df-draft", d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32, max_seq_len=96)
GREEDY = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
SAMPLED = SamplingParams(temperature=1.0, max_tokens=14, seed=7, ignore_eos=True)
PROMPTS = ["hello world, hello world", "the quick brown fox"]


def _engine(draft: bool) -> Engine:
    spec: dict[str, Any] = dict(speculative_model=DRAFT, num_speculative_tokens=3) if draft else {}
    return Engine(EngineConfig(TARGET, block_size=8, num_kv_blocks=64, **spec))


def _run(engine: Engine) -> tuple[list[list[int]], list[int]]:
    ids = [engine.add_request(p, params) for p, params in zip(PROMPTS, (GREEDY, SAMPLED))]
    while engine.has_unfinished():
        engine.step()
    return [engine.get_output(i).token_ids for i in ids], ids


@pytest.fixture(scope="module")
def plain_tokens() -> list[list[int]]:
    with one_torch_thread():
        tokens, _ = _run(_engine(draft=False))
    assert all(len(t) == 14 for t in tokens)
    return tokens


def test_draft_sampling_failure_sends_that_request_to_plain_decoding(plain_tokens: list[list[int]]) -> None:
    engine = _engine(draft=True)
    victim = 1  # the sampled request (ids start at 0): NaN draft logits make its draft draw raise
    real_run = engine.draft.run

    def nan_for_victim(items: list[Any], *args: Any) -> list[torch.Tensor]:
        out = real_run(items, *args)
        return [torch.full_like(o, float("nan")) if it.req.request_id == victim else o for it, o in zip(items, out)]

    engine.draft.run = nan_for_victim
    with one_torch_thread():
        tokens, ids = _run(engine)
    assert ids == [0, 1]
    assert tokens == plain_tokens  # every token, both requests: nothing failed, nothing changed
    assert engine.get_output(victim).finish_reason == "length"
    assert engine.requests[victim].error is None and engine.requests[0].error is None
    assert engine.requests[victim].num_spec_proposed == 0  # it never verified a draft
    assert engine.requests[0].num_spec_proposed > 0  # the other one speculated throughout
    assert (engine.draft_fallbacks.requests, engine.draft_fallbacks.steps) == (1, 0)
    assert engine.draft_fallbacks.off == {victim}


def test_a_failing_draft_forward_makes_that_step_plain(plain_tokens: list[list[int]]) -> None:
    engine = _engine(draft=True)
    real_run = engine.draft.run
    calls = {"n": 0, "failed_step": -1}

    def fails_once(items: list[Any], *args: Any) -> list[torch.Tensor]:
        calls["n"] += 1
        if calls["n"] == 3:  # the 3rd draft forward: inside the first speculative step's proposals
            calls["failed_step"] = engine.step_id
            raise RuntimeError("injected draft forward fault")
        return real_run(items, *args)

    engine.draft.run = fails_once
    verified: list[int] = []
    real_verified = engine.observer.on_spec_verified

    def note(request_id: int, *args: Any) -> None:
        verified.append(engine.step_id)
        real_verified(request_id, *args)

    engine.observer.on_spec_verified = note
    with one_torch_thread():
        tokens, ids = _run(engine)
    # The greedy request's tokens are the target's argmax whichever steps speculated; the sampled one
    # speculated in the other steps (another random stream, the same distribution): all its tokens, no error.
    assert tokens[0] == plain_tokens[0]
    assert len(tokens[1]) == 14 and all(engine.requests[i].error is None for i in ids)
    assert (engine.draft_fallbacks.requests, engine.draft_fallbacks.steps) == (0, 1)
    assert calls["failed_step"] > 0 and calls["failed_step"] not in verified  # no verification in that step
    assert any(step > calls["failed_step"] for step in verified)  # and speculation resumed after it


def test_server_counts_draft_fallbacks_by_scope() -> None:
    counters = ServerCounters()
    counters.draft_fallbacks(requests=2, steps=1)
    reg = counters.registry()
    assert reg.get_sample_value("infersight_server_draft_fallbacks_total", {"scope": "request"}) == 2
    assert reg.get_sample_value("infersight_server_draft_fallbacks_total", {"scope": "step"}) == 1
