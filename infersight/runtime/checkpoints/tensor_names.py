"""Checkpoint tensor names -> the engine's parameters, as vLLM's and nano-vllm's loaders map them.

The engine fuses q, k and v into one `attn.qkv` projection and gate and up into one `gate_up`, so
several checkpoint tensors fill row ranges of one parameter:

    self_attn.q_proj  ->  attn.qkv rows [0, Hq*D)
    self_attn.k_proj  ->  attn.qkv rows [Hq*D, (Hq+Hkv)*D)
    self_attn.v_proj  ->  attn.qkv rows [(Hq+Hkv)*D, (Hq+2Hkv)*D)
    mlp.gate_proj     ->  ffn.gate_up rows [0, F)       (Mixtral: experts.j.w1)
    mlp.up_proj       ->  ffn.gate_up rows [F, 2F)      (Mixtral: experts.j.w3)
"""
from __future__ import annotations

from dataclasses import dataclass

from infersight.runtime.model.model_config import ModelConfig


@dataclass(frozen=True)
class TensorTarget:
    """Where one checkpoint tensor goes: rows [start, start + shape[0]) of `param` (all of a
    1-D parameter), and the shape the tensor must have."""

    param: str
    start: int
    shape: tuple[int, ...]


def _ffn(prefix: str, ours: str, cfg: ModelConfig, gate: str, up: str, down: str) -> dict[str, TensorTarget]:
    d, f = cfg.d_model, cfg.ffn_dim
    return {f"{prefix}.{gate}.weight": TensorTarget(f"{ours}.gate_up.weight", 0, (f, d)),
            f"{prefix}.{up}.weight": TensorTarget(f"{ours}.gate_up.weight", f, (f, d)),
            f"{prefix}.{down}.weight": TensorTarget(f"{ours}.down.weight", 0, (d, f))}


def _attention(hf: str, ours: str, cfg: ModelConfig) -> dict[str, TensorTarget]:
    d, hd = cfg.d_model, cfg.head_dim
    q_rows, kv_rows = cfg.n_heads * hd, cfg.n_kv_heads * hd
    out: dict[str, TensorTarget] = {}
    for proj, start, rows in (("q_proj", 0, q_rows), ("k_proj", q_rows, kv_rows), ("v_proj", q_rows + kv_rows, kv_rows)):
        out[f"{hf}.{proj}.weight"] = TensorTarget(f"{ours}.qkv.weight", start, (rows, d))
        if cfg.qkv_bias:
            out[f"{hf}.{proj}.bias"] = TensorTarget(f"{ours}.qkv.bias", start, (rows,))
    out[f"{hf}.o_proj.weight"] = TensorTarget(f"{ours}.out.weight", 0, (d, q_rows))
    if cfg.qk_norm:
        out[f"{hf}.q_norm.weight"] = TensorTarget(f"{ours}.q_norm.weight", 0, (hd,))
        out[f"{hf}.k_norm.weight"] = TensorTarget(f"{ours}.k_norm.weight", 0, (hd,))
    return out


def _layer(i: int, cfg: ModelConfig, moe: str) -> dict[str, TensorTarget]:
    hf, ours, d = f"model.layers.{i}", f"layers.{i}", cfg.d_model
    out = {f"{hf}.input_layernorm.weight": TensorTarget(f"{ours}.attn_norm.weight", 0, (d,)),
           f"{hf}.post_attention_layernorm.weight": TensorTarget(f"{ours}.ffn_norm.weight", 0, (d,)),
           **_attention(f"{hf}.self_attn", f"{ours}.attn", cfg)}
    if not moe:
        return {**out, **_ffn(f"{hf}.mlp", f"{ours}.ffn", cfg, "gate_proj", "up_proj", "down_proj")}
    block = f"{hf}.block_sparse_moe" if moe == "mixtral" else f"{hf}.mlp"
    out[f"{block}.gate.weight"] = TensorTarget(f"{ours}.ffn.router.weight", 0, (cfg.n_experts, d))
    names = ("w1", "w3", "w2") if moe == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    for j in range(cfg.n_experts):
        out.update(_ffn(f"{block}.experts.{j}", f"{ours}.ffn.experts.{j}", cfg, *names))
    return out


def checkpoint_tensors(cfg: ModelConfig, moe: str) -> dict[str, TensorTarget]:
    """Every tensor a checkpoint of this config must hold, by name. moe: architectures.Architecture.moe."""
    d = cfg.d_model
    out = {"model.embed_tokens.weight": TensorTarget("embed.weight", 0, (cfg.vocab_size, d)),
           "model.norm.weight": TensorTarget("norm.weight", 0, (d,))}
    for i in range(cfg.n_layers):
        out.update(_layer(i, cfg, moe))
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = TensorTarget("lm_head.weight", 0, (cfg.vocab_size, d))
    return out


#: Tensors a checkpoint may carry that the engine does not read: RoPE tables some exporters save,
#: and the LM head of a tied model (it equals the embedding).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
