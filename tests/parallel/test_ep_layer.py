"""One expert-parallel MoE layer on W=2 gloo ranks against the dense MoEFFN, and its byte accounting
recomputed here independently from the routing."""
from __future__ import annotations

import pytest
import torch

from ep_workers import LAYER_CASES, LAYER_CFG, layer_inputs, run_layer_cases
from gloo_spawn import spawn_local
from infersight.runtime.model.moe import route

WORLD = 2
ELEMENT_BYTES = {torch.float32: 4, torch.bfloat16: 2}


@pytest.fixture(scope="module")
def results():
    per_rank = spawn_local(WORLD, run_layer_cases)
    return list(zip(*per_rank))  # one tuple of rank results per case


def _expected_bytes(dtype: torch.dtype, n_tokens: int, replicas: tuple[tuple[int, int], ...]) -> list[list[int]]:
    """[source rank][peer] bytes, from the routing recomputed here: rank r sources tokens
    [r*ceil.., ...) (first ranks one larger), and a pair goes to the copy g % copies of its
    expert, copies ordered by rank, g its index among all the layer's pairs for that expert in
    token order (over every source's shard)."""
    moe, x = layer_inputs(dtype, n_tokens)
    with torch.inference_mode():
        _, ids = route(moe.router(x), LAYER_CFG.top_k)
    n_exp = LAYER_CFG.n_experts
    copies = {e: [e * WORLD // n_exp] for e in range(n_exp)}
    for e, r in replicas:
        copies[e].append(r)
    copies = {e: sorted(rs) for e, rs in copies.items()}
    out, start = [], 0
    seen = {e: 0 for e in range(n_exp)}
    for r in range(WORLD):
        size = n_tokens // WORLD + (1 if r < n_tokens % WORLD else 0)
        sent = [0] * WORLD
        # pairs in token order per expert (the order is what decides the copy)
        for e in range(n_exp):
            for t in range(start, start + size):
                if e in ids[t].tolist():
                    peer = copies[e][seen[e] % len(copies[e])]
                    seen[e] += 1
                    sent[peer] += LAYER_CFG.d_model * ELEMENT_BYTES[dtype]
        out.append(sent)
        start += size
    return out


def test_every_case_ran_on_both_ranks(results):
    assert len(results) == len(LAYER_CASES)
    for case in results:
        assert [r.stats.rank for r in case] == [0, 1]


def test_output_is_bit_exact_without_replicas(results):
    for case in results:
        if case[0].replicas:
            continue
        for r in case:
            assert r.output.dtype == r.reference.dtype
            assert torch.equal(r.output, r.reference), (r.dtype, r.n_tokens)


def test_output_close_with_replicas(results):
    for case in results:
        if not case[0].replicas:
            continue
        for r in case:
            tol = 1e-6 if r.dtype == torch.float32 else 2e-2
            torch.testing.assert_close(r.output, r.reference, atol=tol, rtol=tol)


def test_bytes_to_peer_equal_rows_times_d_model_times_element_size(results):
    for case in results:
        first = case[0]
        expected = _expected_bytes(first.dtype, first.n_tokens, first.replicas)
        assert [list(r.stats.bytes_to_peer) for r in case] == expected, (first.dtype, first.n_tokens, first.replicas)


def test_tokens_per_local_expert_and_counts_sum_to_routing(results):
    for case in results:
        first = case[0]
        moe, x = layer_inputs(first.dtype, first.n_tokens)
        with torch.inference_mode():
            _, ids = route(moe.router(x), LAYER_CFG.top_k)
        routed = torch.bincount(ids.flatten(), minlength=LAYER_CFG.n_experts)
        received = torch.zeros_like(routed)
        for r in case:
            for e, n in zip(r.stats.expert_ids, r.stats.expert_tokens):
                received[e] += n
        assert torch.equal(received, routed)
        assert torch.equal(sum(r.expert_counts for r in case), routed)
        slots = [len(r.stats.expert_ids) for r in case]
        assert slots == ([2, 2] if not first.replicas else [3, 3])
