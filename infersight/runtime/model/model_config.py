"""Model shapes: the ModelConfig dataclass and a table of named configs.

Torch-free, so the agent and `infersight analyze` can model a captured step's work (roofline)
without importing the runtime.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from infersight.runtime.checkpoints.architectures import model_fields_from_dir
from infersight.runtime.checkpoints.model_dir import is_model_dir
from infersight.runtime.errors import UnknownModelError
from infersight.runtime.tokenizer import ByteTokenizer


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's RoPE frequency scaling (config.json rope_scaling with rope_type "llama3"):
    wavelengths past original_max_positions / low_freq_factor are slowed by `factor`, those under
    original_max_positions / high_freq_factor kept, the band between interpolated."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only transformer. n_experts == 0 means a dense SwiGLU FFN."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    n_experts: int = 0
    top_k: int = 2
    shared_expert: bool = False
    vocab_size: int = ByteTokenizer.vocab_size
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # Fields a Hugging Face checkpoint may set (runtime.checkpoints); the defaults are the named
    # configs' architecture, so their forward is unchanged.
    head_size: int = 0  # 0: d_model // n_heads (Qwen3 sets its own head_dim)
    qkv_bias: bool = False  # Qwen2: biases on the q, k and v projections
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    rope_scaling: Llama3RopeScaling | None = None
    norm_topk_prob: bool = True  # MoE: renormalise the top-k router weights to sum to 1 (Qwen3-MoE: per config)
    tie_word_embeddings: bool = False  # the LM head is the embedding matrix
    checkpoint: str = ""  # a Hugging Face model directory the weights and tokenizer come from
    checkpoint_dtype: str = ""  # its weights' dtype (config.json), what --dtype auto picks on CUDA

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):  # from dataclasses.asdict (a shapes file)
            object.__setattr__(self, "rope_scaling", Llama3RopeScaling(**self.rope_scaling))
        for dim in ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len"):
            if not isinstance(getattr(self, dim), int) or getattr(self, dim) < 1:
                raise ValueError(f"{self.name}: {dim} must be a positive integer, got {getattr(self, dim)!r}")
        if self.head_size < 0:
            raise ValueError(f"{self.name}: head_size must be >= 0, got {self.head_size}")
        if not self.head_size and self.d_model % self.n_heads:
            raise ValueError(f"{self.name}: d_model {self.d_model} not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: n_heads {self.n_heads} not divisible by n_kv_heads {self.n_kv_heads}")
        if self.n_experts and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"{self.name}: top_k {self.top_k} must be in [1, n_experts={self.n_experts}]")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_heads

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0


MODEL_CONFIGS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        # Trained by infersight.training; fine-grained experts keep the weights a few MB.
        ModelConfig("tiny-moe", d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, ffn_dim=128,
                    n_experts=8, top_k=2, shared_expert=False, max_seq_len=1024),
        ModelConfig("tiny-draft", d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256,
                    max_seq_len=1024),
        # Random-weight shapes for GPU benchmarks; the byte vocabulary keeps the LM head small.
        ModelConfig("llama-1b-shape", d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                    ffn_dim=8192, max_seq_len=4096, rope_theta=500000.0),
        # Llama 3 8B's dimensions: enough work per token that a GPU's dynamic power dominates its
        # static power (the energy split's known-answer check on the H200, BENCHMARKS.md).
        ModelConfig("llama-8b-shape", d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                    ffn_dim=14336, max_seq_len=4096, rope_theta=500000.0),
        ModelConfig("mixtral-shape", d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                    ffn_dim=14336, n_experts=8, top_k=2, max_seq_len=4096, rope_theta=1e6),
    )
}


def resolve_model(model: str | ModelConfig) -> ModelConfig:
    """A named config, a Hugging Face model directory (one with a config.json), or the config itself."""
    if isinstance(model, ModelConfig):
        return model
    if model not in MODEL_CONFIGS and is_model_dir(model):
        return ModelConfig(**model_fields_from_dir(model))
    if model not in MODEL_CONFIGS:
        known = ", ".join(sorted(MODEL_CONFIGS))
        raise UnknownModelError(f"unknown model {model!r}; known models: {known}, or a Hugging Face model "
                                 f"directory (one with a config.json)")
    return MODEL_CONFIGS[model]


def model_config_from_dict(fields: dict[str, Any]) -> ModelConfig:
    """A ModelConfig from dataclasses.asdict() output (e.g. a capture's shapes file); unknown keys
    are an error, so a file from a newer version is not silently misread."""
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    extra = sorted(set(fields) - known)
    if extra:
        raise ValueError(f"unknown ModelConfig fields: {', '.join(extra)}")
    return ModelConfig(**fields)
