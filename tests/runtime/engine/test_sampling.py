"""Sampling transforms against plain-Python references, and per-request reproducibility."""
from __future__ import annotations

import math

import pytest
import torch

from infersight.runtime import InvalidRequestError, SamplingParams
from infersight.runtime.engine.sampling import probs_from_logits, sample


def reference_probs(logits: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """Written from the definitions with lists, independent of the tensor code."""
    scaled = [x / temperature for x in logits]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    keep = set(order[:top_k]) if top_k > 0 else set(order)
    m = max(scaled[i] for i in keep)
    weights = {i: math.exp(scaled[i] - m) for i in keep}
    total = sum(weights.values())
    probs = {i: w / total for i, w in weights.items()}
    if top_p < 1.0:
        kept, mass = set(), 0.0
        for i in order:
            if i not in probs:
                continue
            if mass >= top_p:
                break
            kept.add(i)
            mass += probs[i]
        total = sum(probs[i] for i in kept)
        probs = {i: probs[i] / total for i in kept}
    return [probs.get(i, 0.0) for i in range(len(logits))]


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, -1, 1.0), (0.7, -1, 1.0), (1.3, 3, 1.0), (1.0, -1, 0.5), (0.9, 4, 0.8), (1.0, 1, 1.0), (2.0, -1, 0.01),
])
def test_probs_match_reference(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(3, 10, generator=gen) * 3
    got = probs_from_logits(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    for row in range(3):
        want = reference_probs(logits[row].tolist(), temperature, top_k, top_p)
        assert got[row].tolist() == pytest.approx(want, abs=1e-6)


def test_greedy_is_one_hot_on_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [5.0, 4.9, 0.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=0))
    assert probs.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_same_seed_same_samples():
    probs = torch.softmax(torch.randn(50, generator=torch.Generator().manual_seed(0)), -1)
    a = [sample(probs, torch.Generator().manual_seed(5)) for _ in range(3)]
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert [sample(probs, g1) for _ in range(20)] == [sample(probs, g2) for _ in range(20)]
    assert len(set(a)) == 1


@pytest.mark.parametrize("kwargs,needle", [
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": -3}, "max_tokens"), ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
])
def test_bad_params_raise_clear_errors(kwargs, needle):
    with pytest.raises(InvalidRequestError, match=needle):
        SamplingParams(**kwargs)
