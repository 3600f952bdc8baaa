"""The fused forward: Transformer.forward on CUDA in fewer, fused kernels (runtime.model.triton_fused).

Per layer:

    add_rmsnorm -> qkv matmul -> rope_kv (q; k, v into the cache) -> attention
    -> out matmul -> add_rmsnorm -> gate_up matmul -> silu_mul -> down matmul (or the MoE FFN)

A one-token forward (batch-1 decode) runs its projections as runtime.model.triton_gemv's
matrix-vector kernels (gate_up with SiLU·up in the same pass) unless EngineConfig.decode_gemv is
off; more tokens keep cuBLAS. The residual add of each block is deferred into the next add_rmsnorm (vLLM's fused add + norm),
so a dense decode layer is ten kernels where Transformer.forward launches about forty-five, and a
prefill drops the float32 RoPE and RMSNorm passes over every token. Attention is the model's own
(Attention.attend: the paged Triton kernel for single-token decodes, SDPA for prompt segments).

Two entry points: decode() for a batch whose tokens are all single-token decodes with logits
wanted (CUDA graphs capture it; it skips the index copies the general case needs), forward() for
any batch. The same weights and math as the model's modules (runtime.model.triton_fused says where they
round), so the two forwards agree to bf16 rounding, and graph replays and eager decode steps run
the same kernels, so their greedy tokens are identical. CUDA with the Triton decode kernel only;
the CPU keeps Transformer.forward.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from infersight.runtime.model.forward_batch import ForwardBatch
from infersight.runtime.model.layers import SwiGLU
from infersight.runtime.model.transformer import prefill_attention_kernels

if TYPE_CHECKING:
    from infersight.runtime.model.transformer import DecoderLayer, Transformer


def fused_forward_problem(model: "Transformer", device: str, decode_attention: str) -> str | None:
    """Why the fused forward cannot run this model here, or None when it can."""
    if decode_attention != "triton":
        return "needs the Triton decode attention"
    if not device.startswith("cuda"):  # tests run FusedForward itself through Triton's CPU interpreter
        return "not a CUDA device"
    if model.cfg.head_dim % 2:
        return "odd head_dim"
    if model.cfg.qk_norm:  # rope_kv takes q and k straight from the projection
        return "QK norm (Qwen3) is not fused"
    return None


class FusedForward:
    """decode(batch, k_caches, v_caches) and forward(...) -> logits [N, V] float32, like
    Transformer.forward (see the module docstring for which batches decode() takes)."""

    def __init__(self, model: "Transformer", gemv: bool = True) -> None:
        from infersight.runtime.model import triton_fused

        self.model = model
        self.kernels = triton_fused
        self.gemv = None  # one-token products (runtime.model.triton_gemv), when on
        if gemv:
            from infersight.runtime.model import triton_gemv

            self.gemv = triton_gemv

    def _linear(self, x: torch.Tensor, module: torch.nn.Linear) -> torch.Tensor:
        if self.gemv is not None and x.shape[0] == 1:
            return self.gemv.gemv(x, module.weight, module.bias)
        return F.linear(x, module.weight, module.bias)

    def decode(self, batch: ForwardBatch, k_caches: torch.Tensor, v_caches: torch.Tensor) -> torch.Tensor:
        """A pure decode batch: decode_index and logits_index are 0..T-1, no segments."""
        x, delta = self._layers(batch, k_caches, v_caches, decode_only=True)
        _, h = self.kernels.add_rmsnorm(x, delta, self.model.norm.weight, self.model.norm.eps)
        return self._linear(h, self.model.lm_head).float()

    def forward(self, batch: ForwardBatch, k_caches: torch.Tensor, v_caches: torch.Tensor) -> torch.Tensor:
        """Any batch (prefill chunks, decodes, verify windows, mixed)."""
        with prefill_attention_kernels(batch.input_ids.device):
            x, delta = self._layers(batch, k_caches, v_caches, decode_only=False)
        idx = batch.logits_index
        _, h = self.kernels.add_rmsnorm(x[idx], delta[idx], self.model.norm.weight, self.model.norm.eps)
        return self._linear(h, self.model.lm_head).float()

    def _layers(self, batch: ForwardBatch, k_caches: torch.Tensor, v_caches: torch.Tensor, decode_only: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream after the last layer and that layer's FFN output, not yet added."""
        model = self.model
        x = model.embed(batch.input_ids)
        delta: torch.Tensor | None = None
        for i, layer in enumerate(model.layers):
            x, delta = self._layer(layer, i, x, delta, batch, k_caches[i], v_caches[i], decode_only)
        assert delta is not None
        return x, delta

    def _layer(self, layer: "DecoderLayer", i: int, x: torch.Tensor, delta: torch.Tensor | None, batch: ForwardBatch,
               k_cache: torch.Tensor, v_cache: torch.Tensor, decode_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
        kern, attn, rope = self.kernels, layer.attn, self.model.rope
        t = x.shape[0]
        with layer.ranges.range(layer.names["attention"]):
            x, h = kern.add_rmsnorm(x, delta, layer.attn_norm.weight, layer.attn_norm.eps)
            qkv = self._linear(h, attn.qkv)
            q = kern.rope_kv(qkv, rope.cos, rope.sin, batch.positions, batch.slot_mapping, k_cache, v_cache,
                             attn.n_heads)
            if decode_only:
                o = attn.paged_decode(q, k_cache, v_cache, batch.decode_block_tables, batch.decode_context_lens)
            else:
                o = attn.attend(q, batch, k_cache, v_cache)
            attn_out = self._linear(o.view(t, -1), attn.out)
        x, h = kern.add_rmsnorm(x, attn_out, layer.ffn_norm.weight, layer.ffn_norm.eps)
        ffn = layer.ffn
        if isinstance(ffn, SwiGLU):
            with layer.ranges.range(layer.names["mlp"]):
                if self.gemv is not None and t == 1:
                    act = self.gemv.gemv_silu_mul(h, ffn.gate_up.weight, ffn.gate_up.bias)
                else:
                    act = kern.silu_mul(F.linear(h, ffn.gate_up.weight, ffn.gate_up.bias))
                return x, self._linear(act, ffn.down)
        counts = batch.expert_counts[i] if batch.expert_counts is not None else None
        return x, ffn(h, counts)
