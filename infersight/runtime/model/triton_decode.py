"""Paged split-KV decode attention as two Triton kernels (the GPU path; the torch one is the reference).

The torch version in attention.py gathers each sequence's pages into a float32 copy before its
einsums: on a GPU that moves about five times the KV bytes the math needs and launches a dozen
kernels per layer. Here one program per (sequence, KV head, split) walks its share of the context
straight out of the pool, BLOCK_T tokens (several pages) per iteration, reading each K/V row once
for all the query heads that share it (GQA: the group's heads are the rows of one tl.dot), with an
online softmax in registers; a second kernel merges the splits (skipped when there is one split).

Splits are cut per sequence: each sequence's own context is divided evenly among the n_splits
programs, so a block table padded far past the context (a CUDA graph's fixed-width input) costs
no reads and no idle splits beyond the empty ones. The grid depends only on shapes, never on
context values, so nothing is copied to the host and the launch can be captured in a CUDA graph.

Exactness: scores and the P@V product are float32-accurate. Float32 caches use IEEE float32 dots.
16-bit caches multiply 16-bit q and K exactly into float32 accumulators, and P (float32) is split
into a 16-bit high and low part, two dots, so P keeps 16 significant bits where one 16-bit cast
would keep 8. Shapes follow paged_decode_attention. Import this module only where triton is installed.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class DecodeTuning:
    """Launch parameters. target_programs: programs to aim for across (sequence, KV head, split),
    several per SM on an H100/H200 (132 SMs). Defaults: the best geometric mean over four shapes
    of a 36-point sweep on the H200 (benchmarks/decode_attention.py --sweep, 2026-12-01)."""

    block_t: int = 64
    num_warps: int = 2
    num_stages: int = 2
    target_programs: int = 1024


DEFAULT_TUNING = DecodeTuning()


@triton.jit
def _paged_decode_split_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, m_ptr, l_ptr, o_ptr, out_ptr, scale,
                  stride_qb, stride_qh, stride_kblk, stride_kt, stride_kh, stride_tb, stride_ob, stride_oh,
                  split_tokens, n_splits,
                  GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr,
                  PAGE: tl.constexpr, BLOCK_T: tl.constexpr, DIRECT: tl.constexpr, F32: tl.constexpr,
                  DOT_F32: tl.constexpr):
    h = tl.program_id(0)  # fastest: the KV heads of one token are adjacent, so neighbours share pages
    b = tl.program_id(1)
    s = tl.program_id(2)
    ctx = tl.load(lens_ptr + b).to(tl.int32)
    if split_tokens > 0:
        tps = split_tokens
    else:  # this sequence's context cut evenly, in whole tiles
        tps = tl.cdiv(tl.cdiv(ctx, n_splits), BLOCK_T) * BLOCK_T
    start = s * tps
    end = tl.minimum(start + tps, ctx)
    n_tiles = tl.cdiv(tl.maximum(end - start, 0), BLOCK_T)
    g = tl.arange(0, GROUP_P)
    d = tl.arange(0, DIM_P)
    t = tl.arange(0, BLOCK_T)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + (h * GROUP + g)[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    if F32:
        q = q.to(tl.float32)
    else:  # 16-bit q times 16-bit K is exact in the float32 accumulator; scale applied after
        q = q.to(k_ptr.dtype.element_ty)
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, DIM_P], tl.float32)
    table = tables_ptr + b.to(tl.int64) * stride_tb
    for i in range(0, n_tiles):
        tok = start + i * BLOCK_T + t
        t_ok = tok < end  # tokens past the split or the context are never read
        page = tl.load(table + tok // PAGE, mask=t_ok, other=0).to(tl.int64)
        rows = page * stride_kblk + (tok % PAGE) * stride_kt + h * stride_kh
        kv_ok = t_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + rows[:, None] + d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(v_ptr + rows[:, None] + d[None, :], mask=kv_ok, other=0.0)
        if F32:
            scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        elif DOT_F32:  # the interpreter's 16-bit dot is broken; the fp32 products are the same values
            scores = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = tl.where(t_ok[None, :], scores * scale, float("-inf"))  # [GROUP_P, BLOCK_T]
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        if F32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            p_hi = p.to(v.dtype)
            p_lo = (p - p_hi.to(tl.float32)).to(v.dtype)
            if DOT_F32:
                vf = v.to(tl.float32)
                pv = (tl.dot(p_hi.to(tl.float32), vf, input_precision="ieee")
                      + tl.dot(p_lo.to(tl.float32), vf, input_precision="ieee"))
            else:
                pv = tl.dot(p_hi, v) + tl.dot(p_lo, v)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if DIRECT:  # one split: split 0 holds token 0, so l > 0
        out = acc / l_i[:, None]
        tl.store(out_ptr + b * stride_ob + (h * GROUP + g)[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])
    else:
        # Partials laid out [B, Hkv, S, GROUP, D] (m, l without D); a split wholly past the context
        # leaves m = -inf, l = 0, o = 0, which the merge weighs as nothing.
        row = ((b * tl.num_programs(0) + h) * n_splits + s) * GROUP + g
        tl.store(m_ptr + row, m_i, mask=g_ok)
        tl.store(l_ptr + row, l_i, mask=g_ok)
        tl.store(o_ptr + row[:, None] * HEAD_DIM + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def _paged_decode_merge_kernel(m_ptr, l_ptr, o_ptr, out_ptr, stride_ob, stride_oh, n_splits,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr, SPLITS_P: tl.constexpr):
    b = tl.program_id(0)
    hq = tl.program_id(1)
    h, g = hq // GROUP, hq % GROUP
    sp = tl.arange(0, SPLITS_P)
    d = tl.arange(0, DIM_P)
    s_ok = sp < n_splits
    d_ok = d < HEAD_DIM
    row = ((b * (tl.num_programs(1) // GROUP) + h) * n_splits + sp) * GROUP + g
    m = tl.load(m_ptr + row, mask=s_ok, other=float("-inf"))
    l = tl.load(l_ptr + row, mask=s_ok, other=0.0)
    o = tl.load(o_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    m_max = tl.max(m, axis=0)  # finite: every sequence has at least one token in split 0
    w = tl.where(l > 0, tl.exp(m - m_max), 0.0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w * l, axis=0)
    tl.store(out_ptr + b * stride_ob + hq * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def split_count(batch: int, kv_heads: int, max_tokens: int, tuning: DecodeTuning = DEFAULT_TUNING) -> int:
    """Splits per (sequence, KV head): enough programs to fill the GPU, none shorter than a tile."""
    wanted = max(1, tuning.target_programs // max(1, batch * kv_heads))
    return max(1, min(wanted, -(-max_tokens // tuning.block_t)))


def triton_paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  block_tables: torch.Tensor, context_lens: torch.Tensor,
                                  scale: float | None = None, blocks_per_split: int | None = None,
                                  tuning: DecodeTuning = DEFAULT_TUNING) -> torch.Tensor:
    """paged_decode_attention's contract (q [B, Hq, D]; caches [N, block_size, Hkv, D]; tables
    [B, max_blocks]; context_lens [B], each >= 1). The table's width bounds the pages read, so
    no context length is copied to the host. blocks_per_split None: each sequence's context is
    split evenly over split_count() programs; else fixed splits of that many pages."""
    b, hq, dim = q.shape
    _, block_size, hkv, _ = k_cache.shape
    if hq % hkv != 0:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    if b == 0:
        return q.new_empty(b, hq, dim)
    if blocks_per_split is not None and blocks_per_split < 1:
        raise ValueError("blocks_per_split must be >= 1")
    group = hq // hkv
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    max_tokens = block_tables.shape[1] * block_size
    if blocks_per_split is None:
        split_tokens, n_splits = 0, split_count(b, hkv, max_tokens, tuning)
    else:
        split_tokens = blocks_per_split * block_size
        n_splits = max(1, -(-max_tokens // split_tokens))
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    tables = block_tables.contiguous()
    out = torch.empty_like(q)
    direct = n_splits == 1
    shape = (1,) if direct else (b, hkv, n_splits, group)
    m = torch.empty(shape, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    o = torch.empty((1,) if direct else (*shape, dim), device=q.device, dtype=torch.float32)
    dim_p = max(16, _pow2(dim))
    _paged_decode_split_kernel[(hkv, b, n_splits)](
        q, k_cache, v_cache, tables, context_lens, m, l, o, out, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), tables.stride(0),
        out.stride(0), out.stride(1), split_tokens, n_splits,
        GROUP=group, GROUP_P=max(16, _pow2(group)), HEAD_DIM=dim, DIM_P=dim_p, PAGE=block_size,
        BLOCK_T=tuning.block_t, DIRECT=direct, F32=k_cache.dtype == torch.float32,
        DOT_F32=os.environ.get("TRITON_INTERPRET") == "1",
        num_warps=tuning.num_warps, num_stages=tuning.num_stages)
    if not direct:
        _paged_decode_merge_kernel[(b, hq)](m, l, o, out, out.stride(0), out.stride(1), n_splits,
                               GROUP=group, HEAD_DIM=dim, DIM_P=_pow2(dim), SPLITS_P=_pow2(n_splits))
    return out


def triton_decode_problem(device: str) -> str | None:
    """None when the kernel compiles and runs on `device` and agrees with the torch reference on a
    small case; else why not (no C compiler for Triton's launcher, an unsupported GPU, ...)."""
    from infersight.runtime.model.attention import paged_decode_attention

    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        k_cache, v_cache = (torch.randn(6, 16, 2, 64, generator=gen).to(device) for _ in range(2))
        q = torch.randn(2, 8, 64, generator=gen).to(device)
        tables = torch.tensor([[4, 1, 0], [2, 5, 3]], device=device)
        lens = torch.tensor([20, 40], device=device)
        got = triton_paged_decode_attention(q, k_cache, v_cache, tables, lens)
        want = paged_decode_attention(q, k_cache, v_cache, tables, lens)
        err = float((got - want).abs().max() / want.abs().max())
    except Exception as exc:  # any failure means: use the torch path
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None if err <= 1e-4 else f"disagrees with the torch reference (relative error {err:.2e})"
