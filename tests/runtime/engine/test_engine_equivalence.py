"""Greedy outputs must not depend on how the engine computes them.

Every configuration below (speculation, prefix caching, preemption by recompute or swap,
batching with chunked prefill, attention backend) must produce exactly the token ids of a
plain reference: one request at a time, no prefix cache, no draft, an ample KV pool, a token
budget larger than any prompt, and the naive attention kernel. Exact token equality is a
strong check because the random-weight models are context sensitive: changing one early
prompt byte changes most greedy continuations, so a KV block read from the wrong place,
a rolled-back draft position left stale or a chunk boundary off by one shows up as a
different token sequence.

float32 is enough here: all paths agree token for token (checked); nothing needed float64.
"""
from __future__ import annotations

import random

import pytest
import torch

from infersight.runtime import LLM, ModelConfig, SamplingParams
from infersight.runtime.model.weights import build_model, save_safetensors

BLOCK = 8
MAX_LEN = 128
MAX_TOKENS = 40
TARGET = ModelConfig("eq-moe", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                     n_experts=4, top_k=2, max_seq_len=MAX_LEN)
# A weak draft: a different (dense, one-layer) random model of the same vocabulary.
DENSE_DRAFT = ModelConfig("eq-dense-draft", d_model=64, n_layers=1, n_heads=4, n_kv_heads=2,
                          ffn_dim=128, max_seq_len=MAX_LEN)
# The target's shape under another name; given perturbed target weights it agrees with the
# target on part of its proposals, so partial acceptance (KV rollback) is exercised.
NOISY_DRAFT = ModelConfig("eq-noisy-draft", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                          ffn_dim=128, n_experts=4, top_k=2, max_seq_len=MAX_LEN)
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

TEXT_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hi",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n# and now a test",
]


def _random_prompts(seed: int, n: int, lo: int, hi: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


# 12 random byte prompts (2..95 tokens) + 3 text prompts; the longest ones reach MAX_LEN before
# MAX_TOKENS and finish by length.
PROMPTS: list[str | list[int]] = _random_prompts(1234, 12, 2, 96) + TEXT_PROMPTS


def _num_prompt_tokens(prompt: str | list[int]) -> int:
    return len(prompt.encode("utf-8")) + 1 if isinstance(prompt, str) else len(prompt)  # + BOS


def _expected_len(prompt: str | list[int], max_tokens: int = MAX_TOKENS) -> int:
    return min(max_tokens, MAX_LEN - _num_prompt_tokens(prompt))


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # These models are tiny: one intra-op thread is faster than two, and far faster when the
    # machine's cores are shared with other jobs.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    llm = LLM(TARGET, block_size=BLOCK, enable_prefix_caching=False, attention_backend="naive",
              max_num_batched_tokens=512)
    outs = [llm.generate([p], GREEDY)[0] for p in PROMPTS]
    for p, o in zip(PROMPTS, outs):
        assert len(o.token_ids) == _expected_len(p)
        assert o.finish_reason == "length"
    return [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def noisy_weights(tmp_path_factory: pytest.TempPathFactory) -> str:
    model = build_model(TARGET, dtype=torch.float32, device="cpu", seed=0)
    gen = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.ndim > 1:
                param.add_(0.1 * param.std() * torch.randn(param.shape, generator=gen))
    path = tmp_path_factory.mktemp("noisy") / "noisy-draft.safetensors"
    save_safetensors(model, path)
    return str(path)


def _tokens(outs) -> list[list[int]]:
    return [o.token_ids for o in outs]


def _expected_proposals(prompt_len: int, max_tokens: int, k: int) -> int:
    """Draft tokens proposed for one request when every proposal is accepted: the first token
    comes from the prefill; each later step proposes min(k, tokens still allowed - 1) drafts
    (never past max_tokens or MAX_LEN) and emits them plus one bonus token."""
    n_out, n_tok, proposed = 1, prompt_len + 1, 0
    while n_out < max_tokens and n_tok < MAX_LEN:
        g = max(0, min(k, max_tokens - n_out - 1, MAX_LEN - n_tok - 1))
        proposed += g
        n_out += g + 1
        n_tok += g + 1
    return proposed


# ------------------------------------------------------------------------------ speculation


@pytest.mark.parametrize("k", [1, 4])
def test_self_draft_accepts_everything_and_matches(reference, k: int) -> None:
    llm = LLM(TARGET, block_size=BLOCK, speculative_model=TARGET, num_speculative_tokens=k)
    outs = llm.generate(PROMPTS, GREEDY)
    assert _tokens(outs) == reference
    for p, o in zip(PROMPTS, outs):
        assert o.num_spec_accepted == o.num_spec_proposed
        assert o.num_spec_proposed == _expected_proposals(_num_prompt_tokens(p), MAX_TOKENS, k)
    assert sum(o.num_spec_proposed for o in outs) > 0


def test_weak_dense_draft_matches(reference) -> None:
    llm = LLM(TARGET, block_size=BLOCK, speculative_model=DENSE_DRAFT, num_speculative_tokens=4)
    outs = llm.generate(PROMPTS, GREEDY)
    assert _tokens(outs) == reference
    assert sum(o.num_spec_proposed for o in outs) > 0


@pytest.mark.parametrize("k", [2, 5])
def test_partially_accepting_draft_matches(reference, noisy_weights: str, k: int) -> None:
    llm = LLM(TARGET, block_size=BLOCK, speculative_model=NOISY_DRAFT,
              speculative_weights=noisy_weights, num_speculative_tokens=k)
    outs = llm.generate(PROMPTS, GREEDY)
    assert _tokens(outs) == reference
    proposed = sum(o.num_spec_proposed for o in outs)
    accepted = sum(o.num_spec_accepted for o in outs)
    assert 0 < accepted < proposed  # both acceptance and rejection (KV rollback) happened


def test_per_request_speculation_mixed_in_one_batch(reference, noisy_weights: str) -> None:
    llm = LLM(TARGET, block_size=BLOCK, speculative_model=NOISY_DRAFT,
              speculative_weights=noisy_weights, num_speculative_tokens=3)
    flags = [i % 2 == 0 for i in range(len(PROMPTS))]
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, use_speculation=f)
              for f in flags]
    outs = llm.generate(PROMPTS, params)
    assert _tokens(outs) == reference
    for f, o in zip(flags, outs):
        if f:
            assert o.num_spec_proposed > 0
        else:
            assert o.num_spec_proposed == 0 and o.num_spec_accepted == 0


# ---------------------------------------------------------------------------- prefix caching

SYSTEM = "You are a helpful assistant. Answer briefly and precisely. Context: " * 2  # 136 bytes
SHARED_PROMPTS: list[str | list[int]] = [SYSTEM[:100] + q for q in
                                         ("Quick question", "Add 2+2.", "Why", "Name a colour.", "x", "Tell me")]


def test_prefix_caching_on_off_same_tokens_and_hits() -> None:
    assert len({p[100] for p in SHARED_PROMPTS}) == len(SHARED_PROMPTS)  # prompts differ right after the prefix
    shared_tokens = 1 + 100  # BOS + common prefix
    max_shared_hit = shared_tokens // BLOCK * BLOCK
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    plain = LLM(TARGET, block_size=BLOCK, enable_prefix_caching=False, attention_backend="naive")
    expected = [plain.generate([p], params)[0].token_ids for p in SHARED_PROMPTS]

    off = LLM(TARGET, block_size=BLOCK, enable_prefix_caching=False, max_num_batched_tokens=64)
    for _ in range(2):
        outs = off.generate(SHARED_PROMPTS, params)
        assert _tokens(outs) == expected
        assert all(o.num_cached_tokens == 0 for o in outs)

    # A 64-token budget admits the prompts over several steps, so later ones find the blocks
    # of the shared prefix that earlier ones computed.
    on = LLM(TARGET, block_size=BLOCK, enable_prefix_caching=True, max_num_batched_tokens=64)
    first = on.generate(SHARED_PROMPTS, params)
    assert _tokens(first) == expected
    hits1 = [o.num_cached_tokens for o in first]
    assert sum(hits1) > 0
    assert all(h <= max_shared_hit and h % BLOCK == 0 for h in hits1)

    # The same batch again: every full prompt block is cached (at least one token is always left
    # to compute, for the logits), so each request hits exactly (len - 1) // BLOCK blocks.
    second = on.generate(SHARED_PROMPTS, params)
    assert _tokens(second) == expected
    hits2 = [o.num_cached_tokens for o in second]
    assert hits2 == [(_num_prompt_tokens(p) - 1) // BLOCK * BLOCK for p in SHARED_PROMPTS]
    assert sum(hits2) > sum(hits1)


def _registered_blocks_are_full(llm: LLM) -> bool:
    return all(len(b.token_ids) == BLOCK for b in llm.engine.kv.pool.blocks if b.block_hash)


@pytest.mark.parametrize("draft", [None, "self", "noisy"])
def test_prefix_cache_covers_generated_tokens(reference, noisy_weights: str, draft: str | None) -> None:
    """A follow-up turn whose prompt is prompt + answer + more hits the answer's blocks too,
    also when the answer was produced by speculation (accepted drafts get KV before they are
    appended to the request: the prefix cache must only ever register full blocks)."""
    kwargs: dict[str, object] = {}
    k = 4
    if draft == "self":
        kwargs = dict(speculative_model=TARGET, num_speculative_tokens=k)
    elif draft == "noisy":
        kwargs = dict(speculative_model=NOISY_DRAFT, speculative_weights=noisy_weights, num_speculative_tokens=k)
    llm = LLM(TARGET, block_size=BLOCK, **kwargs)
    prompts = PROMPTS[:8]
    outs = llm.generate(prompts, GREEDY)
    assert _tokens(outs) == reference[:8]
    assert _registered_blocks_are_full(llm)

    follow = [o.prompt_token_ids + o.token_ids + [7, 7, 7] for o in outs]
    follow = [f[: MAX_LEN - 1] for f in follow]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    outs2 = llm.generate(follow, one)
    assert _registered_blocks_are_full(llm)
    for o, o2 in zip(outs, outs2):
        total = len(o.prompt_token_ids) + len(o.token_ids)  # the first turn's tokens; the last has no KV
        usable = (min(total - 1, len(o2.prompt_token_ids) - 1)) // BLOCK * BLOCK
        if draft is None:
            assert o2.num_cached_tokens == usable
        else:
            # The last step may emit up to k + 1 tokens at once; blocks it completes are not
            # registered before the request finishes. Everything before is.
            floor = min(total - (k + 1), len(o2.prompt_token_ids) - 1) // BLOCK * BLOCK
            assert floor <= o2.num_cached_tokens <= usable


# -------------------------------------------------------------------------------- preemption


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("speculate", [False, True])
def test_preemption_matches_ample_pool(reference, noisy_weights: str, mode: str, speculate: bool) -> None:
    # 18 blocks of 8 tokens: one full-length sequence (16 blocks) fits, 15 concurrent requests don't.
    cpu_blocks = 0 if mode == "recompute" else 1000
    kwargs: dict[str, object] = {}
    if speculate:
        kwargs = dict(speculative_model=NOISY_DRAFT, speculative_weights=noisy_weights, num_speculative_tokens=3)
    llm = LLM(TARGET, block_size=BLOCK, num_kv_blocks=18, cpu_offload_blocks=cpu_blocks,
              max_num_batched_tokens=64, **kwargs)
    outs = llm.generate(PROMPTS, GREEDY)
    assert _tokens(outs) == reference
    assert any(o.num_preemptions > 0 for o in outs)
    reasons = {r for o in outs for _, r in o.times.preemptions}
    assert reasons == {mode}
    for o in outs:
        assert len(o.times.preemptions) == o.num_preemptions
        assert len(o.times.resumptions) == o.num_preemptions  # every preempted request came back
    # Nothing leaked: every device block is free again and the CPU tier is empty.
    assert llm.engine.kv.pool.num_in_use == 0
    assert len(llm.engine.kv.cpu_free) == cpu_blocks


def test_small_cpu_tier_mixes_swap_and_recompute(reference) -> None:
    llm = LLM(TARGET, block_size=BLOCK, num_kv_blocks=18, cpu_offload_blocks=12, max_num_batched_tokens=64)
    outs = llm.generate(PROMPTS, GREEDY)
    assert _tokens(outs) == reference
    reasons = [r for o in outs for _, r in o.times.preemptions]
    assert set(reasons) == {"swap", "recompute"}
    assert llm.engine.kv.pool.num_in_use == 0
    assert len(llm.engine.kv.cpu_free) == 12


# --------------------------------------------------------------------- batching and chunking


def test_batch_with_chunked_prefill_matches_one_at_a_time(reference) -> None:
    budget = 24
    assert sum(_num_prompt_tokens(p) > budget for p in PROMPTS) >= 5
    single = LLM(TARGET, block_size=BLOCK, max_num_batched_tokens=512)
    one_by_one = [single.generate([p], GREEDY)[0] for p in PROMPTS]
    assert _tokens(one_by_one) == reference

    batched = LLM(TARGET, block_size=BLOCK, max_num_batched_tokens=budget)
    outs = batched.generate(PROMPTS, GREEDY)
    assert _tokens(outs) == reference
    for p, o in zip(PROMPTS, outs):
        assert o.num_preemptions == 0
        chunks = [n for _, _, n in o.times.prefill_chunks]
        assert all(0 < n <= budget for n in chunks)
        # The chunks cover exactly the prompt tokens that were not prefix-cache hits.
        assert sum(chunks) == _num_prompt_tokens(p) - o.num_cached_tokens
        if _num_prompt_tokens(p) - o.num_cached_tokens > budget:
            assert len(chunks) >= 2


def test_many_identical_and_varied_requests_in_one_batch(reference) -> None:
    # Duplicates of the same prompt in one batch share prefix blocks while they are being filled.
    prompts = PROMPTS + PROMPTS[:6]
    llm = LLM(TARGET, block_size=BLOCK, max_num_batched_tokens=40, max_num_seqs=8)
    outs = llm.generate(prompts, GREEDY)
    assert _tokens(outs) == reference + reference[:6]


# ------------------------------------------------------------------------ attention backends


def test_attention_backends_agree(reference) -> None:
    """flash, naive and sdpa serve prefill chunks (budget 24) and speculative verify windows
    (self-draft); decodes go through the paged kernel in all three."""
    results = {}
    for backend in ("flash", "naive", "sdpa"):
        llm = LLM(TARGET, block_size=BLOCK, attention_backend=backend, max_num_batched_tokens=24,
                  speculative_model=TARGET, num_speculative_tokens=3)
        outs = llm.generate(PROMPTS, GREEDY)
        assert all(o.num_spec_accepted == o.num_spec_proposed for o in outs)
        results[backend] = _tokens(outs)
    assert results["flash"] == results["naive"] == results["sdpa"] == reference


def test_packed_prefill_matches(reference, noisy_weights: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """EngineConfig.packed_prefill: a step's prefill chunks (budget 40) and verify windows (a partly
    accepting draft: windows of every length) attend as one masked call per layer; the tokens are the
    reference's, and steps of two and more segments did run packed, in the target and in the draft."""
    llm = LLM(TARGET, block_size=BLOCK, packed_prefill=True, max_num_batched_tokens=40, speculative_model=NOISY_DRAFT,
              speculative_weights=noisy_weights, num_speculative_tokens=3)
    segments_packed: dict[str, list[int]] = {"target": [], "draft": []}
    for name in segments_packed:
        runner = getattr(llm.engine, name)
        build = runner.build_batch

        def spy(items, expert_counts, build=build, seen=segments_packed[name]):  # type: ignore[no-untyped-def]
            batch = build(items, expert_counts)
            assert (batch.packed is not None) == (len(batch.segments) >= 2)
            if batch.packed is not None:
                seen.append(len(batch.segments))
            return batch
        monkeypatch.setattr(runner, "build_batch", spy)
    outs = llm.generate(PROMPTS, GREEDY)
    assert _tokens(outs) == reference
    assert 0 < sum(o.num_spec_accepted for o in outs) < sum(o.num_spec_proposed for o in outs)
    assert segments_packed["target"] and max(segments_packed["target"]) >= 3, segments_packed
    assert segments_packed["draft"], segments_packed


# ------------------------------------------------------------------------ seeded sampling


@pytest.mark.parametrize("speculate", [False, True])
def test_seeded_sampling_independent_of_batch_and_preemption(noisy_weights: str, speculate: bool) -> None:
    """A request with a seed draws from its own generator, so at temperature > 0 its tokens
    must not depend on the batch around it, on chunking, on prefix hits or on preemption.

    With speculation the realisation (not the distribution) legitimately depends on how many
    drafts each step proposes: a recompute preemption re-prefills the request, and that step
    samples one token without drafts, so the generator is consumed differently from the run
    without preemption. Swap keeps the request's state, so it is checked with speculation;
    recompute only without."""
    kwargs: dict[str, object] = {}
    if speculate:
        kwargs = dict(speculative_model=NOISY_DRAFT, speculative_weights=noisy_weights, num_speculative_tokens=3)
    params = [SamplingParams(temperature=t, top_p=tp, top_k=tk, max_tokens=MAX_TOKENS, seed=100 + i,
                             ignore_eos=True)
              for i, (t, tp, tk) in enumerate([(1.0, 1.0, -1), (0.7, 0.9, -1), (1.3, 1.0, 20)] * 5)]
    assert len(params) == len(PROMPTS)
    alone = LLM(TARGET, block_size=BLOCK, enable_prefix_caching=False, **kwargs)
    expected = [alone.generate([p], sp)[0].token_ids for p, sp in zip(PROMPTS, params)]
    assert all(len(t) == _expected_len(p) for p, t in zip(PROMPTS, expected))
    # A 24-token budget would also cap the number of drafts per step: keep it ample with speculation.
    budget = 512 if speculate else 24
    for cpu_blocks in ((1000,) if speculate else (0, 1000)):
        llm = LLM(TARGET, block_size=BLOCK, num_kv_blocks=18, cpu_offload_blocks=cpu_blocks,
                  max_num_batched_tokens=budget, **kwargs)
        outs = llm.generate(PROMPTS, params)
        assert any(o.num_preemptions for o in outs)
        assert _tokens(outs) == expected
