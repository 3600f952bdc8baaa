"""The experts of an MoE layer computed without a host sync: route on the device, one grouped GEMM.

The per-expert loop (moe.MoEFFN's reference path) copies the per-expert token counts to the host
every layer, to slice the sorted tokens, and launches a few kernels per expert. Here the (token,
slot) pairs are sorted by expert on the device and every expert's slice is multiplied in one call:
torch._grouped_mm where it runs (bf16 on Hopper), else a padded batched matmul whose capacity is
the worst case (all T * top_k pairs on one expert), so shapes never depend on the routing. Each
expert's weights are read once either way; the padded path does n_experts times the FLOPs, which
only decode-sized batches can afford. Nothing here creates a host tensor or reads a device value,
so it can run inside a CUDA graph.

The experts' weights are stacked once into [E, 2F, d] and [E, d, F] tensors, and each expert's
parameters become views of them: no second copy, and checkpoints keep their per-expert names.
"""
from __future__ import annotations

import torch
from torch import nn

#: Largest T * top_k the padded path is chosen for: its n_experts x FLOPs stay under the time of
#: reading the experts up to about here on an H200 (mixtral shape: ~4.7 us of GEMM per pair at
#: 600 TFLOP/s against 0.66 ms of weight reads per layer).
PADDED_MAX_PAIRS = 128


def expert_histogram(expert_ids: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Tokens routed to each expert, [n_experts] int64, computed on the device (torch.bincount
    on CUDA reads the maximum id back to the host to size its output)."""
    flat = expert_ids.flatten()
    return torch.zeros(n_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))


def grouped_mm_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when torch._grouped_mm runs on (device, dtype) without a host sync and agrees with
    per-group matmuls. On CUDA only bf16 on Hopper has the grouped kernel; other dtypes fall back
    to a loop that copies the offsets to the host (offs.cpu()): a sync every layer, and inside a
    CUDA graph capture "Cannot copy between CPU and CUDA tensors ... unless the CPU tensor is
    pinned" (the tiny-moe float32 demo engine lost its decode graphs to it). The call runs under
    torch.cuda's sync debug mode "error", so any such fallback is caught here, whatever its dtype."""
    if not hasattr(torch, "_grouped_mm"):
        return "torch has no _grouped_mm"
    on_cuda = torch.device(device).type == "cuda"
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(24, 32, generator=gen).to(device, dtype)
        b = torch.randn(3, 16, 32, generator=gen).to(device, dtype)
        offs = torch.tensor([8, 8, 24], dtype=torch.int32, device=device)
        if on_cuda:
            torch.cuda.synchronize(device)
        previous = torch.cuda.get_sync_debug_mode() if on_cuda else 0
        if on_cuda:
            torch.cuda.set_sync_debug_mode("error")
        try:
            got = torch._grouped_mm(a, b.transpose(-2, -1), offs=offs)
        finally:
            if on_cuda:
                torch.cuda.set_sync_debug_mode(previous)
        want = torch.cat([a[:8].float() @ b[0].float().T, a[8:].float() @ b[2].float().T])
        err = float((got.float() - want).abs().max() / want.abs().max())
    except Exception as exc:  # any failure (a host sync included) means: use the padded path
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None if err <= 1e-2 else f"disagrees with matmul (relative error {err:.2e})"


class StackedExperts:
    """The experts' SwiGLU weights as two stacked tensors, re-made if the parameters moved."""

    def __init__(self) -> None:
        self.gate_up: torch.Tensor | None = None  # [E, 2F, d]
        self.down: torch.Tensor | None = None     # [E, d, F]

    def get(self, experts: nn.ModuleList) -> tuple[torch.Tensor, torch.Tensor]:
        # A .to() or load that replaced the parameters leaves them off the stack: stack again.
        if (self.gate_up is None or self.down is None
                or experts[0].gate_up.weight.data_ptr() != self.gate_up.data_ptr()
                or experts[-1].down.weight.data_ptr() != self.down[-1].data_ptr()):
            self.gate_up = self._stack([e.gate_up for e in experts])
            self.down = self._stack([e.down for e in experts])
        return self.gate_up, self.down

    @staticmethod
    def _stack(linears: list[nn.Linear]) -> torch.Tensor:
        with torch.no_grad():
            stacked = torch.stack([lin.weight for lin in linears])
            for i, lin in enumerate(linears):
                lin.weight = nn.Parameter(stacked[i], requires_grad=lin.weight.requires_grad)
        return stacked


def run_experts_grouped(x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor, counts: torch.Tensor,
                        gate_up: torch.Tensor, down: torch.Tensor, padded: bool) -> torch.Tensor:
    """sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) for each token t, with no host sync.

    x [T, d]; weights, expert_ids [T, k]; counts [E] from expert_histogram; gate_up [E, 2F, d],
    down [E, d, F]. padded: the batched-matmul path instead of torch._grouped_mm. Slot sums run in
    slot order; for top_k = 2 that equals the loop's ascending-expert order bit for bit."""
    t, k = expert_ids.shape
    flat = expert_ids.flatten()
    order = torch.argsort(flat, stable=True)
    xs = x[order // k]                                                    # [T*k, d], grouped by expert
    if padded:
        y = _padded_swiglu(xs, flat[order], counts, gate_up, down)
    else:
        offs = counts.cumsum(0).to(torch.int32)
        gate, up = torch._grouped_mm(xs, gate_up.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
        y = torch._grouped_mm(nn.functional.silu(gate) * up, down.transpose(-2, -1), offs=offs)
    y = y * weights.flatten()[order].unsqueeze(-1).to(x.dtype)
    unsorted = torch.empty_like(y)
    unsorted[order] = y
    return unsorted.view(t, k, -1).sum(dim=1)


def _padded_swiglu(xs: torch.Tensor, sorted_ids: torch.Tensor, counts: torch.Tensor,
                   gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """The experts on [E, capacity, d] slots, capacity = all pairs: static shapes, E x the FLOPs."""
    n, d = xs.shape
    n_experts = gate_up.shape[0]
    starts = counts.cumsum(0) - counts
    rank = torch.arange(n, device=xs.device) - starts[sorted_ids]          # position within its expert
    slots = xs.new_zeros(n_experts, n, d)
    slots[sorted_ids, rank] = xs
    gate, up = torch.bmm(slots, gate_up.transpose(-2, -1)).chunk(2, dim=-1)
    y = torch.bmm(nn.functional.silu(gate) * up, down.transpose(-2, -1))   # [E, n, d]
    return y[sorted_ids, rank]
