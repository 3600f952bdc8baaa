"""Paged split-KV decode attention as two Triton kernels (the GPU path; the torch one is the reference).

The torch version in attention.py gathers each sequence's pages into a float32 copy before its
einsums: on a GPU that moves about five times the KV bytes the math needs and launches a dozen
kernels per layer. Here one program per (sequence, KV head, split) walks its pages straight out of
the pool, reading each K/V row once for all the query heads that share it (GQA), and keeps an
online softmax in registers; a second kernel merges the splits. So a decode step's attention reads
what the roofline model says it must: the KV cache, once.

Math is float32 throughout (products by broadcasting, not tl.dot: decode is bound by memory, and
this keeps the result within float32 rounding of the reference for any head or block size).
Shapes follow paged_decode_attention. Import this module only where triton is installed.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

# Programs to aim for across (sequence, KV head, split): several per SM on an H100/H200 (132 SMs).
_TARGET_PROGRAMS = 1024


@triton.jit
def _paged_decode_split_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, m_ptr, l_ptr, o_ptr, scale,
                  stride_qb, stride_qh, stride_kblk, stride_kt, stride_kh, stride_tb,
                  blocks_per_split, n_splits, block_size,
                  GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr,
                  BLOCK_P: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    ctx = tl.load(lens_ptr + b)
    g = tl.arange(0, GROUP_P)
    d = tl.arange(0, DIM_P)
    t = tl.arange(0, BLOCK_P)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + (h * GROUP + g)[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32) * scale
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, DIM_P], tl.float32)
    first = s * blocks_per_split
    for i in range(0, blocks_per_split):
        start = (first + i) * block_size
        if start < ctx:  # pages past this sequence's context are padding: never read them
            page = tl.load(tables_ptr + b * stride_tb + first + i)
            tok = start + t
            t_ok = (t < block_size) & (tok < ctx)
            rows = page * stride_kblk + t[:, None] * stride_kt + h * stride_kh + d[None, :]
            kv_ok = t_ok[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + rows, mask=kv_ok, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + rows, mask=kv_ok, other=0.0).to(tl.float32)
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)          # [GROUP_P, BLOCK_P]
            scores = tl.where(t_ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new
    # Partials laid out [B, Hkv, S, GROUP, D] (m, l without D); a split wholly past the context
    # leaves m = -inf, l = 0, o = 0, which the merge weighs as nothing.
    row = ((b * tl.num_programs(1) + h) * n_splits + s) * GROUP + g
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


def triton_paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  block_tables: torch.Tensor, context_lens: torch.Tensor,
                                  scale: float | None = None, blocks_per_split: int | None = None) -> torch.Tensor:
    """paged_decode_attention's contract (q [B, Hq, D]; caches [N, block_size, Hkv, D]; tables
    [B, max_blocks]; context_lens [B], each >= 1). The table's width bounds the pages read, so
    no context length is copied to the host. blocks_per_split None: enough splits to fill the GPU."""
    b, hq, dim = q.shape
    _, block_size, hkv, _ = k_cache.shape
    if hq % hkv != 0:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    if b == 0:
        return q.new_empty(b, hq, dim)
    group = hq // hkv
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    n_blocks = block_tables.shape[1]
    if blocks_per_split is None:
        splits_wanted = max(1, _TARGET_PROGRAMS // (b * hkv))
        blocks_per_split = max(1, -(-n_blocks // splits_wanted))
    if blocks_per_split < 1:
        raise ValueError("blocks_per_split must be >= 1")
    n_splits = max(1, -(-n_blocks // blocks_per_split))
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    tables = block_tables.contiguous()
    m = torch.empty(b, hkv, n_splits, group, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    o = torch.empty(b, hkv, n_splits, group, dim, device=q.device, dtype=torch.float32)
    _paged_decode_split_kernel[(b, hkv, n_splits)](
        q, k_cache, v_cache, tables, context_lens, m, l, o, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), tables.stride(0),
        blocks_per_split, n_splits, block_size,
        GROUP=group, GROUP_P=_pow2(group), HEAD_DIM=dim, DIM_P=_pow2(dim), BLOCK_P=_pow2(block_size))
    out = torch.empty_like(q)
    _paged_decode_merge_kernel[(b, hq)](m, l, o, out, out.stride(0), out.stride(1), n_splits,
                           GROUP=group, HEAD_DIM=dim, DIM_P=_pow2(dim), SPLITS_P=_pow2(n_splits))
    return out


def triton_decode_problem(device: str) -> str | None:
    """None when the kernel compiles and runs on `device` and agrees with the torch reference on a
    small case; else why not (no C compiler for Triton's launcher, an unsupported GPU, ...)."""
    from infersight.runtime.attention import paged_decode_attention

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
