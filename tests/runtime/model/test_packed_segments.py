"""Tests for infersight.runtime.model.packed_segments: the packed form of a step's segments on a
hand-worked case, and attention through it against naive attention of each segment alone."""
from __future__ import annotations

import pytest
import torch

from infersight.runtime.config import EngineConfig, ModelConfig
from infersight.runtime.model.attention import naive_attention
from infersight.runtime.model.forward_batch import ForwardBatch, Segment
from infersight.runtime.model.packed_segments import SegmentSpan, pack_segments, packed_kernel
from infersight.runtime.model.transformer import Attention


def test_two_segments_packed_by_hand() -> None:
    # block size 4. A: batch rows 1-3 are positions 2-4 of a sequence on blocks 7, 2 (5 tokens of context).
    # B: rows 5-6 are positions 0-1 of a sequence on block 3. Row 0 and row 4 are decodes (not packed).
    spans = [SegmentSpan(start=1, length=3, context_len=5, blocks=[7, 2, 9]), SegmentSpan(5, 2, 2, [3])]
    p = pack_segments(spans, block_size=4, device="cpu")
    assert p.q_index.tolist() == [1, 2, 3, 5, 6]
    # A's positions 0-3 on block 7 (slots 28-31), position 4 on block 2 (slot 8); B's 0-1 on block 3.
    assert p.kv_slots.tolist() == [28, 29, 30, 31, 8, 12, 13]
    assert p.mask.tolist() == [
        # keys: A0     A1     A2     A3     A4     B0     B1
        [True, True, True, False, False, False, False],   # A, position 2
        [True, True, True, True, False, False, False],    # A, position 3
        [True, True, True, True, True, False, False],     # A, position 4
        [False, False, False, False, False, True, False],  # B, position 0
        [False, False, False, False, False, True, True],   # B, position 1
    ]
    with pytest.raises(ValueError):
        pack_segments([], block_size=4, device="cpu")


def test_two_segments_packed_for_the_varlen_kernel_by_hand() -> None:
    # the case above: the same rows and slots, and instead of a mask each segment's bounds in them
    spans = [SegmentSpan(start=1, length=3, context_len=5, blocks=[7, 2, 9]), SegmentSpan(5, 2, 2, [3])]
    p = pack_segments(spans, block_size=4, device="cpu", kernel="varlen")
    assert p.q_index.tolist() == [1, 2, 3, 5, 6]
    assert p.kv_slots.tolist() == [28, 29, 30, 31, 8, 12, 13]
    assert p.mask is None
    assert p.cu_q is not None and p.cu_k is not None
    assert (p.cu_q.tolist(), p.cu_k.tolist(), p.max_q, p.max_k) == ([0, 3, 5], [0, 5, 7], 3, 5)
    assert p.cu_q.dtype == p.cu_k.dtype == torch.int32  # what flash's kernel takes
    assert pack_segments(spans, block_size=4, device="cpu").mask is not None


def test_the_varlen_kernel_only_where_flash_runs() -> None:
    # decided before any CUDA call: these hold on a machine without a GPU
    assert packed_kernel("cpu", torch.bfloat16, 64) == "masked"
    assert packed_kernel("cuda", torch.float32, 64) == "masked"
    assert packed_kernel("cuda:0", torch.float64, 64) == "masked"


def _cache_with_tables(gen: torch.Generator, contexts: list[int], block_size: int, hkv: int, d: int
                       ) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """A float64 cache and one shuffled, non-contiguous block list per sequence."""
    needed = [-(-c // block_size) for c in contexts]
    num_blocks = 2 * sum(needed) + 3
    k = torch.randn(num_blocks, block_size, hkv, d, generator=gen, dtype=torch.float64)
    v = torch.randn(num_blocks, block_size, hkv, d, generator=gen, dtype=torch.float64)
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables, at = [], 0
    for n in needed:
        tables.append(ids[at:at + n])
        at += n
    return k, v, tables


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_attention_is_each_segments_own_attention(seed: int) -> None:
    """A step of one decode and three segments (a whole prompt, a chunk after a prefix, a verify-like window):
    packed, every segment row is naive causal attention over that sequence's own context alone (float32,
    the reference's precision) and the per-segment path's (float64), and the decode row is unchanged."""
    gen = torch.Generator().manual_seed(seed)
    cfg = ModelConfig("pack-test", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
    attn = Attention(cfg, backend="sdpa").double()
    bs, hkv, d = 4, cfg.n_kv_heads, cfg.head_dim
    # (rows in the step, context): decode of a 6-token context; prompt of 5; chunk of 3 after 7; window of 4 after 9
    layout = [(1, 6), (5, 5), (3, 10), (4, 13)]
    k_cache, v_cache, tables = _cache_with_tables(gen, [c for _, c in layout], bs, hkv, d)
    t = sum(n for n, _ in layout)
    q = torch.randn(t, cfg.n_heads, d, generator=gen, dtype=torch.float64)
    starts = [sum(n for n, _ in layout[:i]) for i in range(len(layout))]
    segs = [Segment(s, n, c, torch.tensor(tab)) for s, (n, c), tab in zip(starts, layout, tables) if n > 1]
    spans = [SegmentSpan(s, n, c, tab) for s, (n, c), tab in zip(starts, layout, tables) if n > 1]
    batch = ForwardBatch(input_ids=torch.zeros(t, dtype=torch.long), positions=torch.zeros(t, dtype=torch.long),
                         slot_mapping=torch.zeros(t, dtype=torch.long), segments=segs,
                         decode_index=torch.tensor([0]), decode_block_tables=torch.tensor([tables[0]]),
                         decode_context_lens=torch.tensor([6]), logits_index=torch.tensor([t - 1]))
    per_segment = attn.attend(q, batch, k_cache, v_cache)
    batch.packed = pack_segments(spans, bs, "cpu")
    packed = attn.attend(q, batch, k_cache, v_cache)
    for s, (n, c), tab in zip(starts, layout, tables):
        if n == 1:
            assert torch.equal(packed[s], per_segment[s])
            continue
        slots = [tab[p // bs] * bs + p % bs for p in range(c)]
        ks, vs = (x.view(-1, hkv, d)[slots] for x in (k_cache, v_cache))
        want = naive_attention(q[s:s + n], ks, vs, causal=True, q_offset=c - n)  # computed in float32
        assert (packed[s:s + n] - want).abs().max() <= 1e-5 * want.abs().max(), (s, n, c)
        # both paths are float64 SDPA over the same keys: equal up to the order of float64 sums
        assert torch.allclose(packed[s:s + n], per_segment[s:s + n], rtol=0, atol=1e-12), (s, n, c)


def test_packed_prefill_runs_on_sdpa() -> None:
    assert EngineConfig(model="tiny-moe", device="cpu", packed_prefill=True).resolved_attention_backend == "sdpa"
    assert EngineConfig(model="tiny-moe", device="cpu").resolved_attention_backend == "flash"
    for backend in ("flash", "naive"):
        with pytest.raises(ValueError, match="packed_prefill"):
            EngineConfig(model="tiny-moe", device="cpu", packed_prefill=True, attention_backend=backend)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash's variable-length kernel runs on CUDA only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_varlen_packed_attention_is_each_segments_own_attention_on_cuda(dtype: torch.dtype) -> None:
    """The varlen kernel (CUDA, 16-bit, GQA 4:2, head_dim 64) against naive attention of each segment alone
    in float32 over the same 16-bit inputs: a whole prompt, chunks after prefixes, a one-block window."""
    assert packed_kernel("cuda", dtype, 64) == "varlen"
    gen = torch.Generator().manual_seed(3)
    cfg = ModelConfig("pack-test", d_model=256, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=512)
    attn = Attention(cfg, backend="sdpa").to("cuda", dtype)
    bs, hkv, d = 16, cfg.n_kv_heads, cfg.head_dim
    layout = [(1, 40), (37, 37), (64, 300), (5, 21), (16, 16 + 130)]  # (rows in the step, context); row 0 decodes
    k64, v64, tables = _cache_with_tables(gen, [c for _, c in layout], bs, hkv, d)
    k_cache, v_cache = k64.to("cuda", dtype), v64.to("cuda", dtype)
    t = sum(n for n, _ in layout)
    q = torch.randn(t, cfg.n_heads, d, generator=gen).to("cuda", dtype)
    starts = [sum(n for n, _ in layout[:i]) for i in range(len(layout))]
    spans = [SegmentSpan(s, n, c, tab) for s, (n, c), tab in zip(starts, layout, tables) if n > 1]
    batch = ForwardBatch(input_ids=torch.zeros(t, dtype=torch.long), positions=torch.zeros(t, dtype=torch.long),
                         slot_mapping=torch.zeros(t, dtype=torch.long), segments=[],
                         decode_index=torch.tensor([0], device="cuda"),
                         decode_block_tables=torch.tensor([tables[0]], device="cuda"),
                         decode_context_lens=torch.tensor([40], device="cuda"), logits_index=torch.tensor([t - 1]))
    batch.packed = pack_segments(spans, bs, "cuda", kernel="varlen")
    got = attn.attend(q, batch, k_cache, v_cache).float()
    for s, (n, c), tab in zip(starts, layout, tables):
        slots = [tab[p // bs] * bs + p % bs for p in range(c)]
        ks, vs = (x.view(-1, hkv, d)[slots].float() for x in (k_cache, v_cache))
        want = naive_attention(q[s:s + n].float(), ks, vs, causal=True, q_offset=c - n)
        # 16-bit inputs, float32 accumulation in both; the output rounded to 16 bits once
        assert (got[s:s + n] - want).abs().max() <= 2e-2 * want.abs().max(), (s, n, c)
