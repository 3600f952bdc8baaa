"""config.json -> ModelConfig: transformers 4.x and 5.x key names read alike, what the engine
cannot compute refused by name, a shapes-file round trip, and --dtype auto's pick."""
from __future__ import annotations

import dataclasses

import pytest

from hf_tiny_checkpoints import needs_transformers
from infersight.runtime.checkpoints.architectures import model_fields
from infersight.runtime.errors import UnknownModelError
from infersight.runtime.model.model_config import Llama3RopeScaling, ModelConfig, model_config_from_dict

LLAMA_V5 = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 300, "max_position_embeddings": 256,
            "rms_norm_eps": 1e-6, "dtype": "bfloat16", "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}
LLAMA_V4 = {**{k: v for k, v in LLAMA_V5.items() if k not in ("rope_parameters", "dtype")},
            "torch_dtype": "bfloat16", "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 32}}


def test_transformers_4_and_5_key_names_give_one_config() -> None:
    v5, v4 = (ModelConfig(**model_fields(c, "m", "m/config.json")) for c in (LLAMA_V5, LLAMA_V4))
    assert v5 == v4
    assert v5.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 32) and v5.rope_theta == 500000.0
    assert (v5.n_kv_heads, v5.head_dim, v5.tie_word_embeddings, v5.checkpoint_dtype) == (2, 16, True, "bfloat16")


@pytest.mark.parametrize(("change", "message"), [
    ({"architectures": ["GPT2LMHeadModel"]}, "architecture 'GPT2LMHeadModel' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"attention_bias": True}, "attention_bias / mlp_bias"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope type 'yarn' is not supported"),
    ({"hidden_size": None}, None),
])
def test_what_the_engine_cannot_compute_is_refused_by_name(change: dict, message: str | None) -> None:
    config = {k: v for k, v in {**LLAMA_V5, **change}.items() if v is not None}
    with pytest.raises(UnknownModelError, match=message or "config.json has no 'hidden_size'"):
        model_fields(config, "m", "m/config.json")


def test_a_checkpoint_config_round_trips_through_a_shapes_file() -> None:
    cfg = ModelConfig(**model_fields(LLAMA_V5, "m", "m/config.json"))
    assert model_config_from_dict(dataclasses.asdict(cfg)) == cfg


@needs_transformers
def test_dtype_auto_is_the_checkpoints_on_cuda_and_float32_on_the_cpu(hf_checkpoints: dict) -> None:
    from infersight.runtime.config import resolve_dtype

    directory = str(hf_checkpoints["qwen2"])  # saved in float32
    assert resolve_dtype("auto", "cuda", directory) == "float32"
    assert resolve_dtype("auto", "cpu", directory) == "float32"
    assert resolve_dtype("auto", "cuda", "tiny-moe") == "bfloat16"
