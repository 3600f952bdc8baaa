"""Fused elementwise kernels of a transformer layer (Triton; the GPU path of runtime.model.forward_fused).

A decode step of a small model is dominated by its small kernels, not its matmuls: in eager
PyTorch one RMSNorm is six kernels, one RoPE eight, and the residual add, the K/V cache writes and
SiLU * up are more. Here each group is one kernel, as vLLM's fused_add_rms_norm and rotary +
reshape_and_cache kernels do:

    add_rmsnorm   x + delta (the residual, stored) and RMSNorm of the sum, one pass over a row
    rope_kv       RoPE of q and k out of the qkv projection; q to its own buffer, k and v
                  straight into the paged cache at each token's slot
    silu_mul      silu(gate) * up out of the fused gate_up projection

Each kernel rounds where the torch modules of runtime.model.layers round (the residual sum and the
normalised row in the model dtype, RoPE and SiLU in float32), so a fused forward follows the same
numbers up to float32 reduction order and FMA contraction. Import only where triton is installed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@triton.jit
def _add_rmsnorm_kernel(x_ptr, d_ptr, w_ptr, sum_ptr, out_ptr, n_cols, eps, stride_x, stride_d, stride_s, stride_o,
                        HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_DELTA:
        d = tl.load(d_ptr + row * stride_d + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(sum_ptr.dtype.element_ty)  # x + delta in the model dtype
        tl.store(sum_ptr + row * stride_s + cols, x, mask=ok)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    y = (xf * inv).to(x_ptr.dtype.element_ty)  # RMSNorm casts the normalised row back first
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    tl.store(out_ptr + row * stride_o + cols, (y.to(tl.float32) * w.to(tl.float32)).to(out_ptr.dtype.element_ty),
             mask=ok)


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, RMSNorm(x + delta) * weight) for x, delta [T, d]; delta None: (x, RMSNorm(x))."""
    t, n = x.shape
    out = torch.empty(t, n, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    total = torch.empty_like(x) if delta is not None else x
    if t:
        d = delta if delta is not None else x
        block = _pow2(n)
        _add_rmsnorm_kernel[(t,)](x, d, weight, total, out, n, eps, x.stride(0), d.stride(0), total.stride(0),
                                  out.stride(0), HAS_DELTA=delta is not None, BLOCK=block,
                                  num_warps=min(16, max(1, block // 256)))
    return total, out


@triton.jit
def _rope_kv_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, stride_qkv, stride_cos,
                    stride_qt, stride_slot, N_HEADS: tl.constexpr, N_KV: tl.constexpr, HEAD_DIM: tl.constexpr,
                    HALF: tl.constexpr, HALF_P: tl.constexpr, HEADS_P: tl.constexpr):
    # One program per (token, HEADS_P heads): heads 0..N_HEADS-1 are q's, then the KV heads.
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * HEADS_P + tl.arange(0, HEADS_P)[:, None]
    i = tl.arange(0, HALF_P)[None, :]
    ok = i < HALF
    is_q = (j < N_HEADS) & ok
    is_k = (j >= N_HEADS) & (j < N_HEADS + N_KV) & ok
    pos = tl.load(pos_ptr + t).to(tl.int64)
    c = tl.load(cos_ptr + pos * stride_cos + i, mask=ok, other=0.0)
    s = tl.load(sin_ptr + pos * stride_cos + i, mask=ok, other=0.0)
    src = qkv_ptr + t * stride_qkv + j * HEAD_DIM + i
    x1 = tl.load(src, mask=is_q | is_k, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=is_q | is_k, other=0.0).to(tl.float32)
    o1 = x1 * c - x2 * s  # the rotate-half form of layers.RotaryEmbedding
    o2 = x2 * c + x1 * s
    qdst = q_ptr + t * stride_qt + j * HEAD_DIM + i
    tl.store(qdst, o1.to(q_ptr.dtype.element_ty), mask=is_q)
    tl.store(qdst + HALF, o2.to(q_ptr.dtype.element_ty), mask=is_q)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    row = slot * stride_slot + (j - N_HEADS) * HEAD_DIM + i
    tl.store(k_ptr + row, o1.to(k_ptr.dtype.element_ty), mask=is_k)
    tl.store(k_ptr + row + HALF, o2.to(k_ptr.dtype.element_ty), mask=is_k)
    vsrc = src + N_KV * HEAD_DIM  # KV head j - N_HEADS's v sits N_KV heads after its k
    tl.store(v_ptr + row, tl.load(vsrc, mask=is_k, other=0.0), mask=is_k)
    tl.store(v_ptr + row + HALF, tl.load(vsrc + HALF, mask=is_k, other=0.0), mask=is_k)


def rope_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
            slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, n_heads: int) -> torch.Tensor:
    """qkv [T, (H + 2 Hkv) * D] -> rotated q [T, H, D]; rotated k and v written to the caches
    [num_blocks, block_size, Hkv, D] at slots [T]. cos, sin [max_positions, D / 2] float32."""
    t = qkv.shape[0]
    _, _, n_kv, dim = k_cache.shape
    if dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {dim}")
    q = torch.empty(t, n_heads, dim, dtype=qkv.dtype, device=qkv.device)
    if t:
        if qkv.stride(1) != 1 or cos.stride(1) != 1 or sin.stride(0) != cos.stride(0) or not k_cache.is_contiguous() \
                or not v_cache.is_contiguous():
            raise ValueError("rope_kv needs row-major qkv, cos/sin and contiguous caches")
        half = dim // 2
        # A prompt: all of a token's heads per program; a decode step: more, smaller programs (latency).
        heads_p = _pow2(n_heads + n_kv) if t >= 256 else min(8, _pow2(n_heads + n_kv))
        _rope_kv_kernel[(t, triton.cdiv(n_heads + n_kv, heads_p))](qkv, cos, sin, positions, slots, q, k_cache, v_cache, qkv.stride(0), cos.stride(0),
                              q.stride(0), n_kv * dim, N_HEADS=n_heads, N_KV=n_kv, HEAD_DIM=dim, HALF=half,
                              HALF_P=_pow2(half), HEADS_P=heads_p, num_warps=4 if heads_p * half >= 1024 else 1)
    return q


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, n_cols, stride_gu, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + n_cols + cols, mask=ok, other=0.0)
    act = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty)  # silu rounds to the model dtype, then * up
    tl.store(out_ptr + row * stride_o + cols, (act.to(tl.float32) * u.to(tl.float32)).to(out_ptr.dtype.element_ty),
             mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2F] (gate first) -> silu(gate) * up [T, F]."""
    t, two_f = gate_up.shape
    f = two_f // 2
    out = torch.empty(t, f, dtype=gate_up.dtype, device=gate_up.device)
    if t:
        block = min(1024, _pow2(f))
        _silu_mul_kernel[(t, triton.cdiv(f, block))](gate_up, out, f, gate_up.stride(0), out.stride(0), BLOCK=block,
                                                    num_warps=4)
    return out
