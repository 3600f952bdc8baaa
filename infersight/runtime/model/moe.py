"""Mixture-of-experts FFN: softmax router, top-k with renormalised weights, optional shared expert."""
from __future__ import annotations

import torch
from torch import nn

from infersight.runtime.config import ModelConfig
from infersight.runtime.model.layers import SwiGLU
from infersight.runtime.model.moe_experts import (
    PADDED_MAX_PAIRS, StackedExperts, expert_histogram, grouped_mm_problem, run_experts_grouped,
)
from infersight.runtime.ranges import RangeMarker


def route(router_logits: torch.Tensor, top_k: int, renormalise: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts, keep the top_k, renormalise so each token's weights sum to 1
    (Mixtral; Qwen3-MoE where its config says norm_topk_prob; else the top-k probabilities as they are).

    Returns (weights [T, k], expert_ids [T, k])."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, expert_ids = torch.topk(probs, top_k, dim=-1)
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, expert_ids


def choose_path(pairs: int, n_experts: int, grouped_ok: bool) -> str:
    """The GPU expert path for `pairs` (token, slot) pairs. Padded reads every expert and does
    n_experts x the FLOPs: best once most experts are touched anyway (H200, mixtral shape: 86% of
    the touched-weights roofline at batch 16, against 60% for grouped) and while the extra FLOPs
    hide under the weight reads; grouped reads only the touched experts (batch 1: 45% against 23%)."""
    if n_experts <= pairs <= PADDED_MAX_PAIRS or (not grouped_ok and pairs <= PADDED_MAX_PAIRS):
        return "padded"
    return "grouped" if grouped_ok else "loop"


class MoEFFN(nn.Module):
    """Experts are SwiGLU blocks; each expert runs once on the tokens routed to it.

    expert_path picks how: "loop" (one matmul chain per expert, reading the per-expert counts
    on the host: the reference, and the CPU default), "grouped" (torch._grouped_mm) or "padded"
    (batched matmul), both in moe_experts and free of host syncs. None: by device and shape
    (choose_path), so a captured decode step always takes the same path."""

    def __init__(self, cfg: ModelConfig, ranges: RangeMarker, names: dict[str, str]) -> None:
        super().__init__()
        self.ranges, self.router_range, self.experts_range = ranges, names["moe.router"], names["moe.experts"]
        self.top_k = cfg.top_k
        self.renormalise = cfg.norm_topk_prob
        self.n_experts = cfg.n_experts
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(cfg.d_model, cfg.ffn_dim) for _ in range(cfg.n_experts))
        self.shared = SwiGLU(cfg.d_model, cfg.ffn_dim) if cfg.shared_expert else None
        self.expert_path: str | None = None
        self._grouped_ok: bool | None = None
        self._stacked = StackedExperts()

    def forward(self, x: torch.Tensor, expert_counts: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, d]. expert_counts, when given, is this layer's row of the step's [layers, experts]
        counter; it is incremented on the device so no host sync happens here."""
        path = self._path(x)
        with self.ranges.range(self.router_range):
            weights, expert_ids = route(self.router(x), self.top_k, self.renormalise)
            counts = None
            if path != "loop":
                counts = expert_histogram(expert_ids, self.n_experts)
            elif expert_counts is not None:
                # The loop reads the counts on the host anyway, so bincount's sync costs nothing more
                # here, and the loop takes them as they are: one histogram, not two.
                counts = torch.bincount(expert_ids.flatten(), minlength=self.n_experts)
            if expert_counts is not None:
                expert_counts += counts
        with self.ranges.range(self.experts_range):
            if path == "loop" or counts is None:
                return self._run_experts(x, weights, expert_ids, counts)
            gate_up, down = self._stacked.get(self.experts)
            out = run_experts_grouped(x, weights, expert_ids, counts, gate_up, down, padded=path == "padded")
            return out + self.shared(x) if self.shared is not None else out

    def learn_grouped(self, device: torch.device, dtype: torch.dtype) -> None:
        """Decide now whether the grouped GEMM works on (device, dtype), as the first forward would:
        CUDA graphs are captured before any forward has run, and a layer that does not know its path
        yet keeps its steps off graphs (cuda_graphs.moe_syncs_host)."""
        if self._grouped_ok is None and device.type != "cpu":
            self._grouped_ok = grouped_mm_problem(device, dtype) is None

    def _path(self, x: torch.Tensor) -> str:
        if self.expert_path is not None:
            return self.expert_path
        if x.device.type == "cpu":
            return "loop"
        if self._grouped_ok is None:
            self._grouped_ok = grouped_mm_problem(x.device, x.dtype) is None
        return choose_path(x.shape[0] * self.top_k, self.n_experts, self._grouped_ok)

    def forward_train(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training path: x [..., d] -> (forward()'s output up to rounding, Switch load-balancing loss).

        Every expert runs on every token, weighted by its renormalised top-k weight (0 outside the
        top k): fixed shapes and no host sync, much faster to train than the per-expert loop while
        experts are small (it costs n_experts / top_k times the expert FLOPs). The loss is
        n_experts * sum_i f_i * P_i, f_i the share of top-k assignments that go to expert i and P_i
        the mean router probability of expert i; it is 1.0 when routing is perfectly balanced."""
        flat = x.reshape(-1, x.shape[-1])
        logits = self.router(flat)
        weights, expert_ids = route(logits, self.top_k, self.renormalise)
        probs = torch.softmax(logits.float(), dim=-1)
        share = torch.zeros_like(probs).scatter(1, expert_ids, 1.0).mean(0) / self.top_k  # f_i
        aux = self.n_experts * (share * probs.mean(0)).sum()
        gate_weights = torch.zeros_like(probs).scatter(1, expert_ids, weights)  # [N, E]
        gate_up = torch.stack([e.gate_up.weight for e in self.experts])  # [E, 2F, d]
        down = torch.stack([e.down.weight for e in self.experts])  # [E, d, F]
        gate, up = torch.einsum("nd,efd->enf", flat, gate_up).chunk(2, dim=-1)
        y = torch.einsum("enf,edf->end", nn.functional.silu(gate) * up, down)  # [E, N, d]
        out = (gate_weights.t().unsqueeze(-1) * y).sum(0).to(x.dtype)
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view_as(x), aux

    def _run_experts(self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor,
                     counts: torch.Tensor | None = None) -> torch.Tensor:
        """counts: tokens routed to each expert, when the caller has them already."""
        out = torch.zeros_like(x)
        # Sort the (token, slot) pairs by expert so each expert sees one contiguous slice.
        flat_experts = expert_ids.flatten()
        order = torch.argsort(flat_experts, stable=True)
        token_of = order // self.top_k
        per_expert = (counts if counts is not None else torch.bincount(flat_experts, minlength=self.n_experts)).tolist()
        start = 0
        for e, n in enumerate(per_expert):
            if n == 0:
                continue
            idx = token_of[start:start + n]
            w = weights.flatten()[order[start:start + n]].unsqueeze(-1).to(x.dtype)
            out.index_add_(0, idx, self.experts[e](x[idx]) * w)
            start += n
        if self.shared is not None:
            out = out + self.shared(x)
        return out
