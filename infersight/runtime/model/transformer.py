"""Decoder-only transformer over a paged KV cache: RMSNorm, RoPE, GQA attention, SwiGLU or MoE FFN.

On CUDA a decode forward (Triton decode attention, sync-free MoE paths) reads no device value on
the host and creates no host tensor, so a CUDA graph can hold it (benchmarks/forward_sync_check.py
checks both on the GPU). The per-layer ranges are Python calls: they mark eager forwards and the
capture of a graph, never its replays, whose step and phase ranges come from the graph runner.
"""
from __future__ import annotations

import functools
import inspect
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from infersight.runtime.model.attention import flash_attention, gather_kv, naive_attention, paged_decode_attention
from infersight.runtime.config import ModelConfig
from infersight.runtime.model.forward_batch import ForwardBatch, Segment
from infersight.runtime.model.layers import RMSNorm, RotaryEmbedding, SwiGLU
from infersight.runtime.model.packed_segments import PackedSegments
from infersight.runtime.model.moe import MoEFFN
from infersight.runtime.ranges import RangeMarker, layer_range_names


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int) -> torch.Tensor:
    """torch SDPA with a bottom-right causal mask (queries are the last rows of the context).

    Inputs go in as [1, heads, tokens, head_dim] with the KV heads repeated to the query heads:
    SDPA's flash and memory-efficient kernels take only 4-D inputs, and GQA only in some builds;
    anything else falls back to the float32 math kernel, 20x slower on an 8k prompt.

    On CUDA the choice is held to the flash and memory-efficient kernels: SDPA's default choice on
    the H200 (torch 2.11) cost 63 ms per call when each call had a new (queries, context) shape, as
    chunked prefill in a serving loop does, against 0.1 ms for the same shape repeated and 0.12 ms
    for the memory-efficient kernel on new shapes (benchmarks/sdpa_shapes.py, BENCHMARKS.md).
    The choice is made by prefill_attention_kernels around a whole forward, once per step: entering
    SDPA's kernel context per segment and layer held the serving engine's GIL ~7% of the time on the
    H200 (py-spy --gil, benchmarks/gpu.sh serving_drift)."""
    return _sdpa(q, k, v, q_offset)


# MATH last: any shape the fast kernels refuse still runs.
_CUDA_PREFILL_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def prefill_attention_kernels(device: torch.device) -> AbstractContextManager[None]:
    """The SDPA kernels a forward with multi-token segments may use: on CUDA flash and memory-efficient
    (math last), see sdpa_attention; elsewhere SDPA's own choice."""
    return sdpa_kernel(_CUDA_PREFILL_KERNELS) if device.type == "cuda" else nullcontext()


def masked_sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """torch SDPA of q [Tq, H, D] over k, v [Tk, Hkv, D] under a bool mask [Tq, Tk] (True: attend); the
    packed segments' kernel (runtime.model.packed_segments). Same layout and kernel choice as sdpa_attention."""
    return _sdpa(q, k, v, 0, mask)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: PackedSegments) -> torch.Tensor:
    """Flash attention's variable-length kernel: q [Tq, H, D] and k, v [Tk, Hkv, D] cut into segments by
    packed.cu_q and packed.cu_k, each segment's queries causal over its own keys, aligned to their end
    (the "varlen" packed kernel; CUDA, 16-bit floats: packed_segments.packed_kernel). No mask, no repeated
    KV heads: the kernel reads a KV head for its whole query group."""
    from torch.nn.attention.varlen import varlen_attn  # torch >= 2.10; packed_kernel checked it imports
    assert packed.cu_q is not None and packed.cu_k is not None
    # torch 2.13 asks for enable_gqa when the heads differ; 2.11 has no such argument and takes them as they are
    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] and _varlen_takes_gqa() else {}
    return varlen_attn(q, k, v, packed.cu_q, packed.cu_k, packed.max_q, packed.max_k, window_size=(-1, 0), **gqa)


@functools.cache
def _varlen_takes_gqa() -> bool:
    from torch.nn.attention.varlen import varlen_attn
    return "enable_gqa" in inspect.signature(varlen_attn).parameters


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int,
          mask: torch.Tensor | None = None) -> torch.Tensor:
    lq, lk = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    qh = q.transpose(0, 1).unsqueeze(0)
    kh, vh = (x.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0) if group > 1
              else x.transpose(0, 1).unsqueeze(0) for x in (k, v))
    if mask is None and lq == lk:  # a whole prompt: the plain causal mask, which lets SDPA pick its flash kernel
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    else:
        if mask is None:
            mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=q_offset)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    return out[0].transpose(0, 1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: str, decode_attention: str = "torch") -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=cfg.qkv_bias)
        self.out = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        # Qwen3's QK norm: RMSNorm over each head of q and k, before RoPE; None elsewhere.
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.backend = backend
        self.paged_decode = paged_decode_attention
        if decode_attention == "triton":  # imported only here: triton is a GPU-only dependency
            from infersight.runtime.model.triton_decode import triton_paged_decode_attention
            self.paged_decode = triton_paged_decode_attention

    def _qkv(self, x: torch.Tensor, rope: RotaryEmbedding,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [..., T, d] -> q [..., T, H, D], k and v [..., T, Hkv, D], q and k rotated by position."""
        q, k, v = self.qkv(x).split(
            [self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim, self.n_kv_heads * self.head_dim], -1)
        lead = x.shape[:-1]
        q, k = q.view(*lead, self.n_heads, self.head_dim), k.view(*lead, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, positions), rope(k, positions)
        return q, k, v.view(*lead, self.n_kv_heads, self.head_dim)

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, batch: ForwardBatch,
                k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self._qkv(x, rope, batch.positions)
        # Write this step's K/V first, so every kernel below reads its whole context from the cache.
        k_cache.view(-1, self.n_kv_heads, self.head_dim)[batch.slot_mapping] = k
        v_cache.view(-1, self.n_kv_heads, self.head_dim)[batch.slot_mapping] = v
        return self.out(self.attend(q, batch, k_cache, v_cache).reshape(t, -1))

    def attend(self, q: torch.Tensor, batch: ForwardBatch, k_cache: torch.Tensor, v_cache: torch.Tensor
               ) -> torch.Tensor:
        """q [T, H, D] of the batch's tokens, their K/V already in the cache -> attention out [T, H, D]:
        single-token decodes through the paged decode kernel, multi-token segments through the
        prefill kernel over their gathered context: one call per segment, or one for all of them when
        the batch carries them packed (EngineConfig.packed_prefill)."""
        segs = batch.segments
        if not batch.decode_index.numel() and len(segs) == 1 and segs[0].start == 0 and segs[0].length == q.shape[0]:
            return self._segment(q, segs[0], k_cache, v_cache)  # one prompt chunk alone: no copy into out
        out = torch.empty_like(q)
        if batch.decode_index.numel():
            out[batch.decode_index] = self.paged_decode(
                q[batch.decode_index], k_cache, v_cache, batch.decode_block_tables, batch.decode_context_lens)
        if batch.packed is not None:
            p = batch.packed
            kv_shape = (-1, self.n_kv_heads, self.head_dim)
            ks, vs = k_cache.view(kv_shape)[p.kv_slots], v_cache.view(kv_shape)[p.kv_slots]
            out[p.q_index] = (masked_sdpa_attention(q[p.q_index], ks, vs, p.mask) if p.mask is not None
                              else varlen_attention(q[p.q_index], ks, vs, p))
            return out
        for seg in segs:
            out[seg.start:seg.start + seg.length] = self._segment(q, seg, k_cache, v_cache)
        return out

    def _segment(self, q: torch.Tensor, seg: Segment, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        ks, vs = gather_kv(k_cache, v_cache, seg.block_table, seg.context_len)
        qs = q[seg.start:seg.start + seg.length]
        q_offset = seg.context_len - seg.length
        if self.backend == "sdpa":
            return sdpa_attention(qs, ks, vs, q_offset)
        if self.backend == "naive":
            return naive_attention(qs, ks, vs, causal=True, q_offset=q_offset)
        return flash_attention(qs, ks, vs, causal=True, q_offset=q_offset)

    def forward_train(self, x: torch.Tensor, rope: RotaryEmbedding, positions: torch.Tensor) -> torch.Tensor:
        """Training path: x [B, T, d], causal SDPA over the window itself, no KV cache."""
        b, t, _ = x.shape
        q, k, v = (z.transpose(1, 2) for z in self._qkv(x, rope, positions))  # [B, heads, T, D]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.out(o.transpose(1, 2).reshape(b, t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: str, layer_idx: int, ranges: RangeMarker,
                 decode_attention: str = "torch") -> None:
        super().__init__()
        self.ranges, self.names = ranges, layer_range_names(layer_idx)
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, backend, decode_attention)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn: MoEFFN | SwiGLU = (MoEFFN(cfg, ranges, self.names) if cfg.is_moe
                                     else SwiGLU(cfg.d_model, cfg.ffn_dim))

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, batch: ForwardBatch, layer_idx: int,
                k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        with self.ranges.range(self.names["attention"]):
            x = x + self.attn(self.attn_norm(x), rope, batch, k_cache, v_cache)
        h = self.ffn_norm(x)
        if isinstance(self.ffn, MoEFFN):
            counts = batch.expert_counts[layer_idx] if batch.expert_counts is not None else None
            return x + self.ffn(h, counts)
        with self.ranges.range(self.names["mlp"]):
            return x + self.ffn(h)

    def forward_train(self, x: torch.Tensor, rope: RotaryEmbedding,
                      positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [B, T, d] -> (x, this layer's MoE load-balancing loss, None for a dense FFN)."""
        x = x + self.attn.forward_train(self.attn_norm(x), rope, positions)
        h = self.ffn_norm(x)
        if isinstance(self.ffn, MoEFFN):
            out, aux = self.ffn.forward_train(h)
            return x + out, aux
        return x + self.ffn(h), None


class Transformer(nn.Module):
    """forward() returns logits for the tokens in batch.logits_index only."""

    def __init__(self, cfg: ModelConfig, attention_backend: str = "flash", ranges: RangeMarker | None = None,
                 decode_attention: str = "torch") -> None:
        super().__init__()
        self.cfg = cfg
        ranges = ranges if ranges is not None else RangeMarker()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(DecoderLayer(cfg, attention_backend, i, ranges, decode_attention) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta, cfg.rope_scaling)
        self.tie_weights()

    def tie_weights(self) -> None:
        """With tie_word_embeddings the LM head is the embedding matrix (one parameter); again after
        a to_empty(), which gives each module its own tensor."""
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, batch: ForwardBatch, k_caches: torch.Tensor, v_caches: torch.Tensor) -> torch.Tensor:
        """k_caches/v_caches [n_layers, num_blocks, block_size, n_kv_heads, head_dim]."""
        x = self.embed(batch.input_ids)
        with prefill_attention_kernels(x.device):
            for i, layer in enumerate(self.layers):
                x = layer(x, self.rope, batch, i, k_caches[i], v_caches[i])
        h = self.norm(x[batch.logits_index])
        return self.lm_head(h).float()

    def forward_train(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Plain causal forward for training: tokens [B, T] at positions 0..T-1, no KV cache.

        Returns (logits [B, T, V] float32, aux): aux is the MoE load-balancing loss averaged over
        the MoE layers (0 for a dense model)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)
        aux_losses = []
        for layer in self.layers:
            x, aux = layer.forward_train(x, self.rope, positions)
            if aux is not None:
                aux_losses.append(aux)
        aux_loss = torch.stack(aux_losses).mean() if aux_losses else x.new_zeros((), dtype=torch.float32)
        return self.lm_head(self.norm(x)).float(), aux_loss
