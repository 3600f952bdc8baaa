"""Speculative sampling must leave the target's output distribution unchanged, at every draft position.

End to end: N seeded requests through an engine that drafts GAMMA = 4 tokens per step and N
through one without a draft; the same prompt, temperature 1.0, MAX_TOKENS = 6. The 1st token
comes from the prefill; the next verify step drafts 4 tokens, so tokens 2..6 come from draft
positions 0..3 (accepted, or replaced from the residual at the first rejection) and the bonus,
or from later steps after a rejection. The draft is the target with noise added to every weight,
so every position is reached and both branches happen at each (checked below).

For each key (the token at each of positions 2..6, and each adjacent pair from (1st, 2nd) to
(5th, 6th)) a chi-square test of homogeneity compares the two samples. The false-alarm rate is
fixed and stated: FAMILY_ALPHA = 1e-3 for all ten tests together (Bonferroni: each at 1e-4), so a
correct sampler fails this module once in a thousand runs, whatever the seeds. The seeds are
0 .. N-1 and N .. 2N-1: nothing is picked. Power is shown, not claimed: the same test on the same
sample size detects a sampler that draws the replacement for a rejected draft from p instead of
the residual max(0, p - q), at every draft position.

Unit level: `verify` alone, on fixed small distributions.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import binomtest, chi2_contingency, chisquare
from testkit import one_torch_thread

from infersight.runtime import LLM, EngineObserver, ModelConfig, SamplingParams
from infersight.runtime.engine import step_rows as engine_module  # the rows' sample, sample_batch and verify
from infersight.runtime.engine.sampling import sample
from infersight.runtime.speculative.verify import Verification, verify
from infersight.runtime.model.weights import build_model, save_safetensors

N = 5000
GAMMA = 4
MAX_TOKENS = GAMMA + 2
FAMILY_ALPHA = 1e-3
TARGET = ModelConfig("spx-moe", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                     n_experts=4, top_k=2, max_seq_len=32)
DRAFT = ModelConfig("spx-noisy", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                    n_experts=4, top_k=2, max_seq_len=32)
PROMPT = "Hi"
# Random init gives logits of std ~0.16: nearly uniform over 259 tokens, where a wrong sampler is
# nearly indistinguishable from a right one. Scaling the LM head sharpens the (still random)
# models, so mass sits on tens of tokens and the test has power at every position.
LM_HEAD_SCALE = 30.0
# Noise on every draft weight, relative to that weight tensor's spread: acceptance ~0.46 per position.
DRAFT_NOISE = 0.3
#: Per key: (position a, position b) of the tokens compared; a == b is one token.
KEYS = {**{f"token {k + 1}": (k, k) for k in range(1, MAX_TOKENS)},
        **{f"tokens {k + 1}+{k + 2}": (k, k + 1) for k in range(0, MAX_TOKENS - 1)}}
ALPHA = FAMILY_ALPHA / len(KEYS)


class AcceptanceCount(EngineObserver):
    """Accepted / rejected drafts per draft position, from each verification's accept mask."""

    def __init__(self) -> None:
        self.accepted, self.rejected = Counter(), Counter()

    def on_spec_verified(self, request_id: int, num_proposed: int, num_accepted: int, accept_mask: list[bool],
                         draft_ns: int, verify_ns: int) -> None:
        for i, ok in enumerate(accept_mask):
            (self.accepted if ok else self.rejected)[i] += 1


def _replacement_from_p(draft_tokens: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                        generator: torch.Generator, greedy: bool) -> Verification:
    """A classic bug, for the power check: on rejection, sample the replacement from p itself."""
    tokens, mask = [], []
    for i, x in enumerate(draft_tokens):
        p, q = target_probs[i], draft_probs[i]
        ok = bool(torch.rand((), generator=generator) * q[x] < p[x])
        mask.append(ok)
        if not ok:
            return Verification(tokens + [sample(p, generator)], len(tokens), mask)
        tokens.append(x)
    return Verification(tokens + [sample(target_probs[len(draft_tokens)], generator)], len(draft_tokens), mask)


def _weights(tmp) -> tuple[str, str]:
    model = build_model(TARGET, dtype=torch.float32, device="cpu", seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    save_safetensors(model, tmp / "target.safetensors")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * DRAFT_NOISE * p.std())
    save_safetensors(model, tmp / "draft.safetensors")
    return str(tmp / "target.safetensors"), str(tmp / "draft.safetensors")


def _generate(target_w: str, draft_w: str | None, first_seed: int, observer: EngineObserver | None = None
              ) -> list[list[int]]:
    common = dict(weights=target_w, block_size=16, max_num_seqs=N, max_num_batched_tokens=8 * N,
                  num_kv_blocks=N + 16, enable_prefix_caching=False, observer=observer)
    spec = dict(speculative_model=DRAFT, speculative_weights=draft_w, num_speculative_tokens=GAMMA) if draft_w else {}
    llm = LLM(TARGET, **spec, **common)
    params = [SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=first_seed + i, ignore_eos=True)
              for i in range(N)]
    return [o.token_ids for o in llm.generate([PROMPT] * N, params)]


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    target_w, draft_w = _weights(tmp_path_factory.mktemp("spx"))
    counts = AcceptanceCount()
    with one_torch_thread():  # tiny models: one thread is faster, and robust to a busy machine
        spec = _generate(target_w, draft_w, 0, counts)
        plain = _generate(target_w, None, N)  # disjoint seeds: the two samples are independent
        exact = engine_module.verify
        engine_module.verify = _replacement_from_p
        try:
            wrong = _generate(target_w, draft_w, 0)
        finally:
            engine_module.verify = exact
    return {"spec": spec, "plain": plain, "wrong": wrong, "counts": counts}


def _homogeneity_p(a: list, b: list) -> tuple[float, int]:
    """Chi-square test on the 2 x K table; categories with pooled expected count < 5 per cell
    are merged into one "other" column."""
    ca, cb = Counter(a), Counter(b)
    pooled = ca + cb
    # Expected count of a cell is pooled * (row total / grand total) = pooled / 2 here.
    keep = sorted(k for k, c in pooled.items() if c / 2 >= 5)
    rows = [[c[k] for k in keep] + [len(x) - sum(c[k] for k in keep)] for c, x in ((ca, a), (cb, b))]
    table = np.array(rows)
    table = table[:, table.sum(axis=0) > 0]  # drop an empty "other" column
    _, p, _, _ = chi2_contingency(table)
    return p, len(keep)


def _key_p(samples: dict[str, object], arm: str, key: str) -> tuple[float, int]:
    a, b = KEYS[key]
    pick = (lambda t: t[a]) if a == b else (lambda t: (t[a], t[b]))
    return _homogeneity_p([pick(t) for t in samples[arm]], [pick(t) for t in samples["plain"]])


def test_every_draft_position_is_accepted_and_rejected(samples) -> None:
    assert all(len(t) == MAX_TOKENS for arm in ("spec", "plain", "wrong") for t in samples[arm])
    counts = samples["counts"]
    # Acceptance is ~0.46 per position here: the last one is reached ~400 times, each branch ~200.
    for pos in range(GAMMA):
        assert counts.accepted[pos] >= 150 and counts.rejected[pos] >= 150, (pos, counts.accepted, counts.rejected)


@pytest.mark.parametrize("key", list(KEYS))
def test_token_distribution_unchanged_by_speculation(samples, key: str) -> None:
    p, k = _key_p(samples, "spec", key)
    assert k >= 10  # enough categories kept for the test to mean something
    assert p > ALPHA, f"{key}: chi-square p = {p:.2e} over {k} categories (alpha {ALPHA:.0e})"


@pytest.mark.parametrize("position", range(GAMMA + 1))
def test_the_test_catches_a_wrong_replacement_at_every_position(samples, position: int) -> None:
    """Token position + 2 comes from draft position `position` (GAMMA: the bonus); a replacement
    drawn from p must show there, alone or with the token before it."""
    k = position + 1
    p = min(_key_p(samples, "wrong", f"token {k + 1}")[0], _key_p(samples, "wrong", f"tokens {k}+{k + 1}")[0])
    assert p < ALPHA, f"draft position {position}: the wrong sampler passes (p = {p:.2e})"


# ------------------------------------------------------------------------------- verify()

P0_LIST = [0.5, 0.3, 0.15, 0.05]   # target at the draft position
P1_LIST = [0.4, 0.1, 0.2, 0.3]     # target at the bonus position
Q0_LIST = [0.1, 0.2, 0.3, 0.4]     # draft: very different from P0
P0, P1, Q0 = (torch.tensor(x) for x in (P0_LIST, P1_LIST, Q0_LIST))
TRIALS = 20000


def test_verify_first_token_follows_target_distribution() -> None:
    gen = torch.Generator().manual_seed(2024)
    target = torch.stack([P0, P1])
    first, bonus, n_accepted = [0] * 4, [0] * 4, 0
    for _ in range(TRIALS):
        x = int(torch.multinomial(Q0, 1, generator=gen))
        res = verify([x], Q0[None], target, gen, greedy=False)
        assert res.num_accepted in (0, 1) and len(res.tokens) == res.num_accepted + 1
        assert res.accept_mask == [bool(res.num_accepted)]
        first[res.tokens[0]] += 1
        if res.num_accepted:
            assert res.tokens[0] == x
            bonus[res.tokens[1]] += 1
            n_accepted += 1
    assert chisquare(first, TRIALS * np.array(P0_LIST)).pvalue > ALPHA
    # Accepted with probability sum_x min(p(x), q(x)).
    accept_prob = sum(min(a, b) for a, b in zip(P0_LIST, Q0_LIST))  # 0.5
    assert binomtest(n_accepted, TRIALS, accept_prob).pvalue > ALPHA
    # The bonus token after an accepted draft is a sample of the next position's target.
    assert chisquare(bonus, n_accepted * np.array(P1_LIST)).pvalue > ALPHA


def _one_hot(ids: list[int], v: int = 6) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids), v).float()


def test_verify_greedy_accepts_exactly_on_argmax_match() -> None:
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    q = _one_hot([1, 2, 3])  # ignored by greedy verification
    # All three drafts match the target's argmax: all accepted, plus the bonus argmax.
    res = verify([1, 2, 3], q, _one_hot([1, 2, 3, 4]), gen, greedy=True)
    assert (res.tokens, res.num_accepted, res.accept_mask) == ([1, 2, 3, 4], 3, [True, True, True])
    # The second draft differs: the first is kept, the second replaced by the argmax, stop.
    res = verify([1, 5, 3], q, _one_hot([1, 2, 3, 4]), gen, greedy=True)
    assert (res.tokens, res.num_accepted, res.accept_mask) == ([1, 2], 1, [True, False])
    # The first draft differs.
    res = verify([0, 2, 3], q, _one_hot([1, 2, 3, 4]), gen, greedy=True)
    assert (res.tokens, res.num_accepted, res.accept_mask) == ([1], 0, [False])
    # Soft (non one-hot) target rows: only the argmax counts, whatever q says.
    p = torch.tensor([[0.1, 0.5, 0.4, 0, 0, 0], [0.3, 0.3, 0.4, 0, 0, 0]])
    res = verify([1], torch.tensor([[0.0, 0.0, 1.0, 0, 0, 0]]), p, gen, greedy=True)
    assert (res.tokens, res.num_accepted, res.accept_mask) == ([1, 2], 1, [True])
    res = verify([2], torch.tensor([[0.0, 0.0, 1.0, 0, 0, 0]]), p, gen, greedy=True)
    assert (res.tokens, res.num_accepted, res.accept_mask) == ([1], 0, [False])
    # Greedy verification draws no random numbers.
    assert torch.equal(gen.get_state(), state)


def test_verify_sampling_with_degenerate_distributions_is_exact() -> None:
    gen = torch.Generator().manual_seed(0)
    # p == q one-hot: always accepted; the bonus is the only token p_gamma allows.
    for _ in range(20):
        res = verify([2, 3], _one_hot([2, 3]), _one_hot([2, 3, 5]), gen, greedy=False)
        assert (res.tokens, res.num_accepted, res.accept_mask) == ([2, 3, 5], 2, [True, True])
    # The target gives the draft token probability 0: always rejected, and the residual
    # max(0, p - q) puts all its mass on the target's token.
    for _ in range(20):
        res = verify([2, 3], _one_hot([2, 3]), _one_hot([4, 3, 5]), gen, greedy=False)
        assert (res.tokens, res.num_accepted, res.accept_mask) == ([4], 0, [False])
    # Accepted first draft, rejected second.
    for _ in range(20):
        res = verify([2, 3], _one_hot([2, 3]), _one_hot([2, 1, 5]), gen, greedy=False)
        assert (res.tokens, res.num_accepted, res.accept_mask) == ([2, 1], 1, [True, False])
