"""Matrix-vector products for decode steps of one token (Triton; runtime.model.forward_fused).

At batch 1 a decode step is its weights read once: 1.95 GB for llama-1b-shape, 0.46 ms at the
H200's copy bandwidth. cuBLAS runs these products as small GEMMs and reaches about two thirds of
that bandwidth, less on the smaller projections (qkv, out). Here each program owns BLOCK_N rows of
W and streams them once, every token's x riding along, with float32 accumulation:

    y[n] = sum_k x[k] W[n, k]        (+ bias)                 gemv
    y[f] = silu(g[f]) * u[f]         g, u: rows f and F + f of W   gemv_silu_mul

gemv_silu_mul is the gate_up projection and SiLU·up (triton_fused.silu_mul) in one pass, rounding
where they do (the projection and silu in the model dtype). On the H200, against cuBLAS in the same
call (BENCHMARKS.md): qkv 4.96 / 6.21 µs, out 3.91 / 6.01, gate_up + SiLU·up 18.9 / 20.2, down
10.3 / 13.5. Import only where triton is installed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl



@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, F, stride_w,
                 HAS_BIAS: tl.constexpr, GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols0 = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w
    u_rows = w_ptr + (rows + F).to(tl.int64)[:, None] * stride_w
    # Partial sums stay [BLOCK_N, BLOCK_K] until the end: one reduction, not one per K block.
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + cols0
        ok = row_ok[:, None] & (cols[None, :] < K)
        x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        w = tl.load(w_rows + cols[None, :], mask=ok, other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * x[None, :]
        if GATED:
            u = tl.load(u_rows + cols[None, :], mask=ok, other=0.0, eviction_policy="evict_first")
            acc_u += u.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if GATED:
        up = tl.sum(acc_u, axis=1)
        if HAS_BIAS:
            up += tl.load(b_ptr + rows + F, mask=row_ok, other=0.0).to(tl.float32)
        g = y.to(y_ptr.dtype.element_ty).to(tl.float32)  # the projection rounds to the model dtype
        up = up.to(y_ptr.dtype.element_ty).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(y_ptr.dtype.element_ty).to(tl.float32)
        y = act * up
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


def _config(k: int, gated: bool) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps): the fastest of a grid on the H200 for llama-1b-shape's four
    projections (benchmarks/gemv_bench.py --sweep). Few rows per program, so that even a 2048-row
    product has ~1000 programs in flight; the gated one reads two row sets, so more rows, shorter K."""
    if gated:
        return 16, min(128, triton.next_power_of_2(k)), 8
    return 2, min(1024, triton.next_power_of_2(k)), 4


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, n: int, gated: bool,
            block_n: int | None = None, block_k: int | None = None, num_warps: int = 4) -> torch.Tensor:
    t, k = x.shape
    if t != 1:
        raise ValueError(f"gemv takes one token, got {t}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("gemv needs row-major x and weight")
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    if block_n is None or block_k is None:
        block_n, block_k, num_warps = _config(k, gated)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, y, n, k, n if gated else 0, weight.stride(0),
        HAS_BIAS=bias is not None, GATED=gated, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps)
    return y


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for one token: x [1, K], weight [N, K]."""
    return _launch(x, weight, bias, weight.shape[0], gated=False)


def gemv_silu_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """silu_mul(F.linear(x, weight, bias)) for x [1, K], weight [2F, K] (gate rows first): [1, F]."""
    return _launch(x, weight, bias, weight.shape[0] // 2, gated=True)
