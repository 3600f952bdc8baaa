"""Write a named config with its weights as a Hugging Face model directory that transformers and
vLLM load: a MoE model as Mixtral, a dense one as Llama, and the byte tokenizer as tokenizer.json.

The tensors are the loader's name map read backwards (tensor_names.checkpoint_tensors): each
checkpoint tensor is its rows of the engine's parameter, so loading the export gives back the
same parameters, bit for bit.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from infersight.runtime.checkpoints.byte_tokenizer_json import SPECIAL_TOKENS, byte_tokenizer_json
from infersight.runtime.checkpoints.tensor_names import checkpoint_tensors
from infersight.runtime.errors import UnknownModelError
from infersight.runtime.model.model_config import ModelConfig, resolve_model
from infersight.runtime.tokenizer import ByteTokenizer


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for cfg: MixtralForCausalLM for a MoE config, LlamaForCausalLM otherwise."""
    if cfg.shared_expert or cfg.qkv_bias or cfg.qk_norm or cfg.rope_scaling or (cfg.is_moe and not cfg.norm_topk_prob):
        raise UnknownModelError(f"{cfg.name}: no Mixtral or Llama checkpoint holds this config "
                                f"(shared expert, QKV bias, QK norm, RoPE scaling or unnormalised top-k)")
    common = {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
              "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
              "max_position_embeddings": cfg.max_seq_len, "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.norm_eps,
              "hidden_act": "silu", "tie_word_embeddings": cfg.tie_word_embeddings, "torch_dtype": "float32",
              "bos_token_id": ByteTokenizer.bos_id, "eos_token_id": ByteTokenizer.eos_id,
              "pad_token_id": ByteTokenizer.pad_id}
    if cfg.is_moe:
        return {**common, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "intermediate_size": cfg.ffn_dim, "num_local_experts": cfg.n_experts,
                "num_experts_per_tok": cfg.top_k, "sliding_window": None}
    return {**common, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "intermediate_size": cfg.ffn_dim,
            "attention_bias": False, "mlp_bias": False}


def export_hf(model: str | ModelConfig, out: str | Path, weights: str | Path | None = None) -> Path:
    """Write `model` (a named config; its shipped weights, or `weights`) to the directory `out`."""
    from safetensors.torch import save_file

    from infersight.runtime.model.weights import build_model

    cfg = resolve_model(model)
    config = hf_config(cfg)
    built = build_model(cfg, dtype=torch.float32, device="cpu", seed=0, weights=weights)
    params = dict(built.named_parameters())
    moe = "mixtral" if cfg.is_moe else ""
    tensors = {name: params[t.param][t.start:t.start + t.shape[0]].detach().clone().contiguous()
               for name, t in checkpoint_tensors(cfg, moe).items()}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    special = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    files = {"config.json": config,
             "generation_config.json": {"bos_token_id": SPECIAL_TOKENS["<s>"], "eos_token_id": SPECIAL_TOKENS["</s>"],
                                        "pad_token_id": SPECIAL_TOKENS["<pad>"]},
             "tokenizer.json": byte_tokenizer_json(),
             "tokenizer_config.json": {**special, "tokenizer_class": "PreTrainedTokenizerFast",
                                       "model_max_length": cfg.max_seq_len, "clean_up_tokenization_spaces": False}}
    for name, value in files.items():
        (out / name).write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return out
