"""Tests for infersight.runtime.model.attention: every kernel is checked against naive_attention,
which is itself checked against torch SDPA and a hand-computed case."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from infersight.runtime.model.attention import (
    flash_attention,
    gather_kv,
    merge_partials,
    naive_attention,
    paged_decode_attention,
)

REL_TOL = 1e-5


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs difference relative to the reference's largest magnitude."""
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


def _qkv(gen: torch.Generator, lq: int, lk: int, hkv: int, ratio: int, d: int = 16
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randn(lq, hkv * ratio, d, generator=gen)
    k = torch.randn(lk, hkv, d, generator=gen)
    v = torch.randn(lk, hkv, d, generator=gen)
    return q, k, v


# ---------------------------------------------------------------- naive_attention


def test_naive_matches_sdpa_with_explicit_mask() -> None:
    gen = torch.Generator().manual_seed(0)
    lq, q_offset, hkv, ratio, d = 9, 5, 2, 2, 8
    lk = q_offset + lq
    q, k, v = _qkv(gen, lq, lk, hkv, ratio, d)
    allowed = torch.arange(lk)[None, :] <= (torch.arange(lq) + q_offset)[:, None]  # True = attend
    ref = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(ratio, dim=1).transpose(0, 1),
        v.repeat_interleave(ratio, dim=1).transpose(0, 1),
        attn_mask=allowed,
    ).transpose(0, 1)
    out = naive_attention(q, k, v, causal=True, q_offset=q_offset)
    assert _rel_err(out, ref) <= REL_TOL
    out_nc = naive_attention(q, k, v, causal=False, scale=0.3)
    ref_nc = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(ratio, dim=1).transpose(0, 1),
        v.repeat_interleave(ratio, dim=1).transpose(0, 1),
        scale=0.3,
    ).transpose(0, 1)
    assert _rel_err(out_nc, ref_nc) <= REL_TOL


def test_naive_matches_hand_loops() -> None:
    # 2 queries at positions 1 and 2 (q_offset=1), 3 keys, 2 query heads sharing 1 kv head.
    q = np.array([[[1.0, 0.0], [0.5, -1.0]], [[0.0, 2.0], [1.0, 1.0]]])
    k = np.array([[[1.0, 1.0]], [[-1.0, 0.5]], [[0.0, -2.0]]])
    v = np.array([[[1.0, 2.0]], [[3.0, -1.0]], [[0.5, 0.5]]])
    q_offset, d = 1, 2
    expected = np.zeros((2, 2, 2))
    for i in range(2):
        for h in range(2):
            visible = [j for j in range(3) if j <= q_offset + i]
            scores = [sum(q[i, h, c] * k[j, 0, c] for c in range(d)) / math.sqrt(d) for j in visible]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for c in range(d):
                expected[i, h, c] = sum(w * v[j, 0, c] for w, j in zip(weights, visible)) / total
    out = naive_attention(torch.tensor(q, dtype=torch.float32), torch.tensor(k, dtype=torch.float32),
                          torch.tensor(v, dtype=torch.float32), causal=True, q_offset=q_offset)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_naive_rejects_bad_head_ratio() -> None:
    q = torch.zeros(2, 3, 4)
    k = torch.zeros(2, 2, 4)
    with pytest.raises(ValueError):
        naive_attention(q, k, k)
    with pytest.raises(ValueError):
        flash_attention(q, k, k)


# ---------------------------------------------------------------- flash_attention


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("lq", [1, 7, 33, 130])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_matches_naive(seed: int, ratio: int, lq: int, causal: bool) -> None:
    gen = torch.Generator().manual_seed(1000 * seed + 10 * ratio + lq)
    q, k, v = _qkv(gen, lq, lq, hkv=2, ratio=ratio)
    ref = naive_attention(q, k, v, causal=causal)
    for bq, bk in [(64, 64), (16, 32), (5, 3)]:
        out = flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk)
        assert _rel_err(out, ref) <= REL_TOL, (bq, bk)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("lq,q_offset", [(1, 40), (7, 13), (33, 64), (130, 70)])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_prefill_chunk_after_prefix(seed: int, ratio: int, lq: int, q_offset: int, causal: bool) -> None:
    # A prefill chunk appended to a cached prefix: keys cover prefix + chunk.
    gen = torch.Generator().manual_seed(7 + 100 * seed + lq)
    q, k, v = _qkv(gen, lq, q_offset + lq, hkv=2, ratio=ratio)
    ref = naive_attention(q, k, v, causal=causal, q_offset=q_offset)
    for bq, bk in [(64, 64), (16, 48), (7, 5)]:
        out = flash_attention(q, k, v, causal=causal, q_offset=q_offset, block_q=bq, block_k=bk)
        assert _rel_err(out, ref) <= REL_TOL, (bq, bk)


def test_flash_noncausal_unequal_lengths_and_scale() -> None:
    gen = torch.Generator().manual_seed(3)
    q, k, v = _qkv(gen, 19, 71, hkv=1, ratio=4, d=32)
    ref = naive_attention(q, k, v, causal=False, scale=0.07)
    out = flash_attention(q, k, v, causal=False, scale=0.07, block_q=8, block_k=16)
    assert _rel_err(out, ref) <= REL_TOL


def test_flash_skips_future_blocks() -> None:
    # Keys past the last query position are poisoned with NaN; they sit in whole
    # column blocks that must be skipped, so the output stays finite and exact.
    gen = torch.Generator().manual_seed(4)
    q, k, v = _qkv(gen, 32, 64, hkv=2, ratio=2)
    ref = naive_attention(q, k[:32], v[:32], causal=True)
    k[32:] = float("nan")
    v[32:] = float("nan")
    out = flash_attention(q, k, v, causal=True, block_q=16, block_k=16)
    assert torch.isfinite(out).all()
    assert _rel_err(out, ref) <= REL_TOL


def test_flash_keeps_dtype() -> None:
    gen = torch.Generator().manual_seed(5)
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(gen, 10, 10, hkv=2, ratio=2))
    out = flash_attention(q, k, v, block_q=4, block_k=4)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    ref = naive_attention(q, k, v)
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------- merge_partials


def test_merge_partials_equals_full_softmax() -> None:
    gen = torch.Generator().manual_seed(6)
    scores = torch.randn(3, 12, generator=gen) * 5
    values = torch.randn(12, 4, generator=gen)
    ref = torch.softmax(scores, dim=-1) @ values
    chunks = scores.view(3, 4, 3)  # 4 splits of 3 keys
    m = chunks.amax(dim=-1)
    p = torch.exp(chunks - m.unsqueeze(-1))
    o = torch.einsum("rst,std->rsd", p, values.view(4, 3, 4))
    # Add an empty split (m=-inf, l=0) that must contribute nothing.
    m = torch.cat([m, torch.full((3, 1), float("-inf"))], dim=1)
    l = torch.cat([p.sum(-1), torch.zeros(3, 1)], dim=1)
    o = torch.cat([o, torch.zeros(3, 1, 4)], dim=1)
    assert _rel_err(merge_partials(m, l, o, dim=1), ref) <= REL_TOL


# ---------------------------------------------------------------- paged KV cache


def test_gather_kv_scripted_table() -> None:
    num_blocks, block_size, hkv, d = 6, 4, 2, 3
    k_cache = torch.arange(num_blocks * block_size * hkv * d, dtype=torch.float32).view(
        num_blocks, block_size, hkv, d)
    v_cache = -k_cache
    block_table = torch.tensor([4, 1, 5, 0, 2], dtype=torch.int64)  # longer than needed
    for context_len in [1, 4, 5, 10, 12]:
        exp_k = torch.stack([k_cache[int(block_table[p // block_size]), p % block_size]
                             for p in range(context_len)])
        exp_v = torch.stack([v_cache[int(block_table[p // block_size]), p % block_size]
                             for p in range(context_len)])
        k, v = gather_kv(k_cache, v_cache, block_table, context_len)
        assert k.shape == (context_len, hkv, d) and k.is_contiguous() and v.is_contiguous()
        assert torch.equal(k, exp_k) and torch.equal(v, exp_v)
    with pytest.raises(ValueError):
        gather_kv(k_cache, v_cache, block_table[:2], 9)


def _random_paged_batch(gen: torch.Generator, context_lens: list[int], block_size: int, hkv: int,
                        d: int, extra_cols: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cache plus block tables with shuffled, non-contiguous ids, padded with 0."""
    needed = [-(-c // block_size) for c in context_lens]
    num_blocks = 2 * sum(needed) + 3  # spare blocks so the ids used are non-contiguous
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen)
    ids = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(context_lens), max(needed) + extra_cols, dtype=torch.int64)
    start = 0
    for b, n in enumerate(needed):
        tables[b, :n] = ids[start:start + n]
        start += n
    return k_cache, v_cache, tables


@pytest.mark.parametrize("block_size", [16, 4])
@pytest.mark.parametrize("blocks_per_split", [1, 2, 3])
@pytest.mark.parametrize("ratio", [1, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_paged_decode_matches_naive(block_size: int, blocks_per_split: int, ratio: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed * 97 + block_size + blocks_per_split)
    hkv, d = 2, 16
    lens = [15, 16, 17, 32, 1, 75]
    k_cache, v_cache, tables = _random_paged_batch(gen, lens, block_size, hkv, d)
    q = torch.randn(len(lens), hkv * ratio, d, generator=gen)
    context_lens = torch.tensor(lens, dtype=torch.int64)
    out = paged_decode_attention(q, k_cache, v_cache, tables, context_lens, blocks_per_split=blocks_per_split)
    assert out.shape == q.shape and out.dtype == q.dtype
    for b, n in enumerate(lens):
        k, v = gather_kv(k_cache, v_cache, tables[b], n)
        ref = naive_attention(q[b:b + 1], k, v, causal=False)
        assert _rel_err(out[b:b + 1], ref) <= REL_TOL, (b, n)


def test_paged_decode_ignores_padding_blocks() -> None:
    # Padding ids point at block 0, filled with huge keys: if any padded or
    # past-context position leaked into the softmax it would dominate the output.
    gen = torch.Generator().manual_seed(8)
    lens, block_size = [5, 13], 4
    k_cache, v_cache, tables = _random_paged_batch(gen, lens, block_size, hkv=1, d=8)
    for b, n in enumerate(lens):
        used = -(-n // block_size)
        tables[b, :used] = torch.where(tables[b, :used] == 0, 1, tables[b, :used])  # block 0 never real
        tables[b, used:] = 0
    q = torch.randn(2, 2, 8, generator=gen)
    refs = []
    for b, n in enumerate(lens):
        k, v = gather_kv(k_cache, v_cache, tables[b], n)
        refs.append(naive_attention(q[b:b + 1], k, v, causal=False, scale=0.5))
    k_cache[0] = 1e4
    v_cache[0] = 1e4
    out = paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor(lens), scale=0.5,
                                 blocks_per_split=3)
    for b in range(len(lens)):
        assert _rel_err(out[b:b + 1], refs[b]) <= REL_TOL
