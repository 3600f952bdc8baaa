"""Model shapes (a table of named configs) and the one engine config object."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from infersight.runtime.errors import UnknownModelError
from infersight.runtime.tokenizer import ByteTokenizer


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

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"{self.name}: d_model {self.d_model} not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: n_heads {self.n_heads} not divisible by n_kv_heads {self.n_kv_heads}")
        if self.n_experts and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"{self.name}: top_k {self.top_k} must be in [1, n_experts={self.n_experts}]")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

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
        ModelConfig("mixtral-shape", d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                    ffn_dim=14336, n_experts=8, top_k=2, max_seq_len=4096, rope_theta=1e6),
    )
}


def resolve_model(model: str | ModelConfig) -> ModelConfig:
    """A named config, or the config itself."""
    if isinstance(model, ModelConfig):
        return model
    if model not in MODEL_CONFIGS:
        known = ", ".join(sorted(MODEL_CONFIGS))
        raise UnknownModelError(f"unknown model {model!r}; known models: {known}")
    return MODEL_CONFIGS[model]


_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
           "float16": torch.float16}


@dataclass
class EngineConfig:
    """Everything the engine needs, validated once when built.

    num_kv_blocks: device KV blocks (None: enough for max_num_seqs full-length sequences).
    cpu_offload_blocks: size of the CPU swap tier; 0 disables swapping (preemption recomputes).
    max_num_batched_tokens: the per-step token budget shared by prefill chunks and decodes.
    """

    model: str | ModelConfig = "tiny-moe"
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    weights: str | Path | None = None
    speculative_model: str | ModelConfig | None = None
    speculative_weights: str | Path | None = None
    num_speculative_tokens: int = 4
    enable_prefix_caching: bool = True
    block_size: int = 16
    num_kv_blocks: int | None = None
    cpu_offload_blocks: int = 0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    attention_backend: str = "auto"
    model_config: ModelConfig = field(init=False)
    draft_config: ModelConfig | None = field(init=False)

    def __post_init__(self) -> None:
        self.model_config = resolve_model(self.model)
        self.draft_config = resolve_model(self.speculative_model) if self.speculative_model else None
        if self.draft_config and self.draft_config.vocab_size != self.model_config.vocab_size:
            raise ValueError("speculative_model must share the target's vocabulary")
        if self.draft_config and self.draft_config.max_seq_len < self.model_config.max_seq_len:
            # The draft runs at every position the target reaches; its RoPE table would run out.
            raise ValueError(f"speculative_model max_seq_len {self.draft_config.max_seq_len} is shorter "
                             f"than the target's {self.model_config.max_seq_len}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.attention_backend not in ("auto", "flash", "sdpa", "naive"):
            raise ValueError(f"attention_backend must be auto, flash, sdpa or naive, got {self.attention_backend!r}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "num_speculative_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cpu_offload_blocks < 0:
            raise ValueError(f"cpu_offload_blocks must be >= 0, got {self.cpu_offload_blocks}")
        if self.num_kv_blocks is None:
            per_seq = -(-self.model_config.max_seq_len // self.block_size)
            self.num_kv_blocks = per_seq * min(self.max_num_seqs, 16)
        max_blocks = -(-self.model_config.max_seq_len // self.block_size)
        if self.num_kv_blocks < max_blocks:
            raise ValueError(f"num_kv_blocks={self.num_kv_blocks} cannot hold one max-length sequence "
                             f"({max_blocks} blocks of {self.block_size} tokens)")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def resolved_attention_backend(self) -> str:
        if self.attention_backend != "auto":
            return self.attention_backend
        return "sdpa" if self.device.startswith("cuda") else "flash"

    def replace(self, **changes: object) -> "EngineConfig":
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
