"""config.json -> ModelConfig fields, per architecture (transformers 4.x and 5.x key names).

Every architecture here is a pre-norm decoder with RMSNorm, rotate-half RoPE, GQA attention and
SiLU-gated FFNs, which is the engine's model; an architecture differs only by the fields below.
Anything the engine's model cannot compute (another activation, output biases, a RoPE type other
than default and llama3, dense layers between MoE layers) is refused here, before any weight is read.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infersight.runtime.checkpoints.model_dir import read_json
from infersight.runtime.errors import UnknownModelError


@dataclass(frozen=True)
class Architecture:
    """How one config.json `architectures` entry maps onto the engine's model."""

    qkv_bias: bool = False  # q, k and v projections always carry a bias (Qwen2)
    qk_norm: bool = False   # RMSNorm over each q and k head (Qwen3)
    moe: str = ""           # "", "mixtral" or "qwen3_moe": how the experts are named and routed


ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": Architecture(),
    "MistralForCausalLM": Architecture(),
    "Qwen2ForCausalLM": Architecture(qkv_bias=True),
    "Qwen3ForCausalLM": Architecture(qk_norm=True),
    "MixtralForCausalLM": Architecture(moe="mixtral"),
    "Qwen3MoeForCausalLM": Architecture(qk_norm=True, moe="qwen3_moe"),
}


def architecture_of(config: dict[str, Any], where: str) -> tuple[str, Architecture]:
    names = config.get("architectures") or []
    name = names[0] if isinstance(names, list) and names else None
    if name not in ARCHITECTURES:
        raise UnknownModelError(f"{where}: architecture {name!r} is not supported; supported: "
                                f"{', '.join(sorted(ARCHITECTURES))}")
    return name, ARCHITECTURES[name]


def _rope(config: dict[str, Any], where: str) -> dict[str, Any]:
    """rope_theta and rope_scaling fields: transformers 5 writes rope_parameters, 4.x rope_theta
    and rope_scaling."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return {"rope_theta": float(theta)}
    if kind != "llama3":
        raise UnknownModelError(f"{where}: rope type {kind!r} is not supported (default and llama3 are)")
    scaling = {"factor": float(params["factor"]), "low_freq_factor": float(params["low_freq_factor"]),
               "high_freq_factor": float(params["high_freq_factor"]),
               "original_max_positions": int(params["original_max_position_embeddings"])}
    return {"rope_theta": float(theta), "rope_scaling": scaling}


def _max_positions(config: dict[str, Any], arch_name: str) -> int:
    """max_position_embeddings, capped at the sliding window where one applies: the engine attends
    to the whole context, which equals windowed attention while no sequence outgrows the window."""
    positions = int(config.get("max_position_embeddings", 2048))
    window = config.get("sliding_window")
    applies = config.get("use_sliding_window", False) if arch_name.startswith("Qwen") else True
    if window and applies:
        positions = min(positions, int(window))
    return positions


def _moe(config: dict[str, Any], arch: Architecture, where: str) -> dict[str, Any]:
    if not arch.moe:
        return {"ffn_dim": int(config["intermediate_size"])}
    experts = config.get("num_local_experts", config.get("num_experts"))
    fields = {"n_experts": int(experts), "top_k": int(config["num_experts_per_tok"])}
    if arch.moe == "mixtral":
        return {**fields, "ffn_dim": int(config["intermediate_size"]), "norm_topk_prob": True}
    if int(config.get("decoder_sparse_step", 1)) != 1 or config.get("mlp_only_layers"):
        raise UnknownModelError(f"{where}: dense layers between MoE layers (decoder_sparse_step, "
                                f"mlp_only_layers) are not supported")
    return {**fields, "ffn_dim": int(config["moe_intermediate_size"]),
            "norm_topk_prob": bool(config.get("norm_topk_prob", False))}


def model_fields(config: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    """ModelConfig keyword arguments for a parsed config.json; `where` names it in errors."""
    arch_name, arch = architecture_of(config, where)
    if config.get("hidden_act", "silu") != "silu":
        raise UnknownModelError(f"{where}: hidden_act {config.get('hidden_act')!r} is not supported (silu is)")
    if config.get("mlp_bias") or (config.get("attention_bias") and not arch.qkv_bias):
        raise UnknownModelError(f"{where}: attention_bias / mlp_bias (an output projection bias) is not supported")
    try:
        d_model, n_heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        head_dim = config.get("head_dim") or d_model // n_heads
        return {
            "name": name, "d_model": d_model, "n_layers": int(config["num_hidden_layers"]),
            "n_heads": n_heads, "n_kv_heads": int(config.get("num_key_value_heads") or n_heads),
            "vocab_size": int(config["vocab_size"]), "max_seq_len": _max_positions(config, arch_name),
            "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
            "head_size": int(head_dim) if int(head_dim) * n_heads != d_model else 0,
            "qkv_bias": arch.qkv_bias, "qk_norm": arch.qk_norm,
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
            "checkpoint_dtype": str(config.get("dtype") or config.get("torch_dtype") or ""),
            **_rope(config, where), **_moe(config, arch, where),
        }
    except KeyError as exc:
        raise UnknownModelError(f"{where}: config.json has no {exc.args[0]!r}") from None


def model_fields_from_dir(directory: str | Path) -> dict[str, Any]:
    """ModelConfig keyword arguments for a model directory; its name is the path as given."""
    where = str(Path(directory) / "config.json")
    fields = model_fields(read_json(directory, "config.json"), str(directory), where)
    return {**fields, "checkpoint": str(Path(directory).resolve())}
