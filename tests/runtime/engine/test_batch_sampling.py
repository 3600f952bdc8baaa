"""The batched sampler (sample_batch): per-row transforms against a list-based reference, exact
frequencies, per-request reproducibility whatever the batch, and no NaN/inf for any valid
parameter (issue 17: temperature 1e-40 or top_p below float32's smallest subnormal failed a batch)."""
from __future__ import annotations

import math

import pytest
import torch

from infersight.runtime import LLM, ModelConfig, SamplingParams
from infersight.runtime.engine.sampling import draw_keys, filtered_logits, gumbel_noise, probs_from_logits, sample_batch


def reference_probs(logits: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """From the definitions with plain lists: top-k (ties with the k-th kept), then top-p (smallest
    prefix of the sorted tokens whose mass reaches top_p, at least one)."""
    scaled = [x / temperature for x in logits]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    kept = order[:top_k] if 0 < top_k < len(order) else order
    kth = scaled[kept[-1]]
    keep = [i for i in order if scaled[i] >= kth]
    m = max(scaled[i] for i in keep)
    w = {i: math.exp(scaled[i] - m) for i in keep}
    total = sum(w.values())
    probs = {i: v / total for i, v in w.items()}
    if top_p < 1.0:
        out, mass = {}, 0.0
        for i in order:
            if i in probs and (not out or mass < top_p):
                out[i] = probs[i]
                mass += probs[i]
        total = sum(out.values())
        probs = {i: v / total for i, v in out.items()}
    return [probs.get(i, 0.0) for i in range(len(logits))]


ROWS = [(1.0, -1, 1.0), (0.7, 3, 1.0), (1.3, -1, 0.6), (0.9, 4, 0.8), (2.0, 1, 1.0), (1.0, -1, 0.01), (0.5, 9, 0.95)]


def test_filtered_logits_match_reference_row_by_row() -> None:
    logits = torch.randn(len(ROWS), 10, generator=torch.Generator().manual_seed(3)) * 3
    temps = torch.tensor([t for t, _, _ in ROWS])
    ks = torch.tensor([k if 0 < k < 10 else 10 for _, k, _ in ROWS])
    ps = torch.tensor([p if p < 1 else 2.0 for _, _, p in ROWS])
    got = torch.softmax(filtered_logits(logits, temps, ks, ps), -1)
    for row, (t, k, p) in enumerate(ROWS):
        assert got[row].tolist() == pytest.approx(reference_probs(logits[row].tolist(), t, k, p), abs=1e-6)


def test_frequencies_match_the_distribution() -> None:
    """20000 draws of one request (draw index 0..19999) against the reference probabilities, within
    5 standard errors; tokens outside the top-k/top-p set never appear."""
    n = 20_000
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.3, 0.0, -1.0, -2.0, -5.0]])
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=4),
                   SamplingParams(temperature=1.2, top_p=0.7)):
        tokens = sample_batch(logits.expand(n, -1), [params] * n, [1234] * n, list(range(n)))
        counts = torch.bincount(tokens, minlength=8).tolist()
        want = reference_probs(logits[0].tolist(), params.temperature, params.top_k, params.top_p)
        for c, p in zip(counts, want):
            if p == 0:
                assert c == 0
            else:
                assert abs(c / n - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-4, (params, counts, want)


def test_a_request_draws_the_same_tokens_whatever_else_is_in_the_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen)
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.9, top_k=5),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.1, top_p=0.5),
              SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3, top_p=0.9)]
    seeds, draws = [7, 8, 9, 10, 11, 7], [0, 3, 1, 2, 5, 0]
    together = sample_batch(logits, params, seeds, draws).tolist()
    alone = [sample_batch(logits[i:i + 1], params[i:i + 1], seeds[i:i + 1], draws[i:i + 1]).item()
             for i in range(6)]
    assert together == alone
    reversed_batch = sample_batch(logits.flip(0), params[::-1], seeds[::-1], draws[::-1]).tolist()
    assert reversed_batch[::-1] == together
    assert together[2] == int(logits[2].argmax())


def test_noise_depends_on_seed_and_draw_only() -> None:
    keys = torch.tensor([draw_keys(5, 0), draw_keys(5, 1), draw_keys(6, 0), draw_keys(5, 0)])
    noise = gumbel_noise(keys, 1000)
    assert torch.equal(noise[0], noise[3])
    assert not torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])
    assert torch.isfinite(noise).all()
    # Gumbel(0, 1): mean is the Euler-Mascheroni constant, variance pi^2 / 6.
    big = gumbel_noise(torch.tensor([draw_keys(s, 0) for s in range(200)]), 1000)
    assert float(big.mean()) == pytest.approx(0.5772, abs=0.01)
    assert float(big.var()) == pytest.approx(math.pi ** 2 / 6, abs=0.03)
    assert draw_keys(2**64 - 1, 0) != draw_keys(2**32 - 1, 0)  # the seed's high bits count


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1e-40), SamplingParams(temperature=1e-6), SamplingParams(temperature=5e-324),
    SamplingParams(top_p=1e-45), SamplingParams(top_p=1e-50), SamplingParams(top_p=5e-324, top_k=1),
    SamplingParams(temperature=1e-5, top_p=1e-40, top_k=3),
])
def test_tiny_temperature_or_top_p_is_finite_and_keeps_the_top_token(params: SamplingParams) -> None:
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)) * 5
    argmax = logits.argmax(-1)
    tokens = sample_batch(logits, [params] * 4, [1, 2, 3, 4], [0, 0, 0, 0])
    assert torch.equal(tokens, argmax)  # each of these leaves one token, the most likely
    probs = probs_from_logits(logits, params)
    assert torch.isfinite(probs).all()
    assert torch.equal(probs.argmax(-1), argmax) and torch.allclose(probs.sum(-1), torch.ones(4))


def test_below_sampling_eps_is_greedy() -> None:
    assert SamplingParams(temperature=9.9e-6).greedy and not SamplingParams(temperature=1e-5).greedy


def test_engine_batch_with_extreme_params_serves_every_request() -> None:
    """Issue 17's failure: one request with temperature 1e-40 or top_p 1e-46 failed the whole batch."""
    cfg = ModelConfig("bs-dense", d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=64)
    llm = LLM(cfg, num_kv_blocks=32, block_size=8)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    extreme = [SamplingParams(temperature=1e-40, max_tokens=8, ignore_eos=True),
               SamplingParams(top_p=1e-46, max_tokens=8, ignore_eos=True, seed=3),
               SamplingParams(temperature=0.8, top_k=5, max_tokens=8, ignore_eos=True, seed=4)]
    outs = llm.generate(["abc", "abc", "abc", "abc"], [greedy, *extreme])
    assert [o.finish_reason for o in outs] == ["length"] * 4
    assert outs[1].token_ids == outs[0].token_ids == outs[2].token_ids  # all three pick the argmax
    again = llm.generate(["abc"], [extreme[2]])[0]
    assert again.token_ids == outs[3].token_ids  # seeded: the same tokens outside that batch
