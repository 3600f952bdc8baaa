"""The one engine config object. Model shapes live in model_config (torch-free) and are re-exported."""
from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import torch

from infersight.runtime.model.model_config import MODEL_CONFIGS, ModelConfig, resolve_model

__all__ = ["MODEL_CONFIGS", "EngineConfig", "ModelConfig", "resolve_model"]


_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
           "float16": torch.float16}


def resolve_dtype(dtype: str, device: str, model: str | ModelConfig | None = None) -> str:
    """vLLM's `--dtype auto`: float32 on the CPU; on a GPU a Hugging Face checkpoint's own dtype,
    and bfloat16 for the named configs, which carry none (half the bytes a decode step reads;
    every CUDA path is tested in it)."""
    if dtype != "auto":
        return dtype
    if not device.startswith("cuda"):
        return "float32"
    stored = resolve_model(model).checkpoint_dtype if model is not None else ""
    return stored if stored in ("bfloat16", "float16", "float32") else "bfloat16"


@dataclass
class EngineConfig:
    """Everything the engine needs, validated once when built.

    num_kv_blocks: device KV blocks (None: enough for max_num_seqs full-length sequences).
    cpu_offload_blocks: size of the CPU swap tier; 0 disables swapping (preemption recomputes).
    max_num_batched_tokens: the per-step token budget shared by prefill chunks and decodes.
    attention_backend: prefill attention (auto: sdpa on CUDA, flash on the CPU; or naive).
    packed_prefill: a step with two or more multi-token segments (prefill chunks, verify windows) runs
    their attention as one call per layer (runtime.model.packed_segments), not one call per segment:
    flash's variable-length kernel on CUDA in 16-bit, else sdpa under a block-diagonal causal mask. Runs on
    the sdpa backend (attention_backend auto then resolves to sdpa on the CPU too; flash or naive are
    refused). Off here by default (`serve` turns it on for CUDA, where it measured 1.46-1.57x the client
    tokens/s; on the CPU it gained nothing; BENCHMARKS.md).
    decode_attention: paged decode attention (auto: the Triton kernel on CUDA when triton is
    installed, else the torch reference).
    spec_probe_every: with a speculative model, N >= 2 runs one in N pure-decode steps at each batch
    size without speculation (see runtime.speculative.spec_probe), so the sidecar can time a plain step against
    a speculative one at the same batch size; 0 never does.
    spec_probe_run: the plain pure-decode steps come in runs of this many consecutive steps, one run in
    spec_probe_every x spec_probe_run steps at each batch size (the plain share stays 1 / spec_probe_every).
    With async_scheduling the steps of a run after its first are launched ahead, as a plain engine launches
    its decode steps, so the run's middle steps time the step of the engine one would run without the
    draft (a lone synchronous plain step pays host + device, an async one about the larger). 0 (auto):
    4 with async_scheduling, else 1.
    max_model_len: the longest sequence (prompt + output) the engine serves, vLLM's name; None: the
    model's max_seq_len. A smaller value lets a small KV pool (num_kv_blocks) be used; longer
    prompts are refused (InvalidRequestError).
    enforce_eager: never run decode steps as CUDA graphs (vLLM's name); on the CPU they never are.
    compile_layers: on CUDA, torch.compile each layer's norms, RoPE and SwiGLU (fewer, fused
    kernels; seconds of compilation at start and at new shapes); ignored on the CPU.
    fused_forward: on CUDA with the Triton decode kernel, every forward (decode graphs, eager steps,
    prefill) runs runtime.model.forward_fused's fused kernels; False keeps Transformer.forward (whose norms,
    RoPE and SwiGLU compile_layers compiles). Ignored on the CPU.
    decode_gemv: with fused_forward, a one-token forward (batch-1 decode) runs its projections as
    runtime.model.triton_gemv's matrix-vector kernels; False keeps cuBLAS there.
    async_scheduling: vLLM's name; a steady decode step is launched before the tokens of the step
    still on the device are read, which then feeds them on the device, so the host's work for one
    step overlaps the device's work for the other (runtime.engine.async_steps). Tokens are those of the
    synchronous engine (sampled ones drawn on the device, keyed as it keys them); a request waiting
    for a free slot is admitted one step later. Steps that prefill, preempt or run under
    torch.profiler stay synchronous. With a speculative model, speculative steps run one at a time and
    only the plain probe runs (spec_probe_run) are launched ahead. None (the default): on for CUDA, as
    vLLM turns it on where it is supported; off on the CPU, whose forward runs on the host anyway
    (nothing to overlap). Resolved to a bool here.
    scheduler_delay_factor: vLLM's name; > 0 holds waiting requests back until the oldest has waited
    that many times the last prefill step (or nothing runs), so prefills come in fewer, larger
    steps (runtime.engine.scheduler). 0 (the default) admits at every step.
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
    packed_prefill: bool = False
    decode_attention: str = "auto"
    spec_probe_every: int = 0
    spec_probe_run: int = 0
    max_model_len: int | None = None
    enforce_eager: bool = False
    compile_layers: bool = False
    fused_forward: bool = True
    decode_gemv: bool = True
    async_scheduling: bool | None = None
    scheduler_delay_factor: float = 0.0
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
        if self.packed_prefill and self.resolved_attention_backend != "sdpa":
            raise ValueError(f"packed_prefill runs on attention_backend 'sdpa' (or auto), "
                             f"got {self.attention_backend!r}")
        if self.decode_attention not in ("auto", "torch", "triton"):
            raise ValueError(f"decode_attention must be auto, torch or triton, got {self.decode_attention!r}")
        if self.decode_attention == "triton" and not self.device.startswith("cuda"):
            raise ValueError("decode_attention='triton' needs a CUDA device; use 'torch' (or 'auto') on the CPU")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "num_speculative_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.spec_probe_every < 0 or self.spec_probe_every == 1:
            raise ValueError(f"spec_probe_every must be 0 (off) or >= 2, got {self.spec_probe_every}")
        if self.async_scheduling is None:
            self.async_scheduling = self.device.startswith("cuda")
        if self.spec_probe_run < 0:
            raise ValueError(f"spec_probe_run must be >= 0 (0: auto), got {self.spec_probe_run}")
        if self.spec_probe_run == 0:
            self.spec_probe_run = 4 if self.async_scheduling else 1
        if not 0 <= self.scheduler_delay_factor <= 1000:
            raise ValueError(f"scheduler_delay_factor must be in [0, 1000], got {self.scheduler_delay_factor}")
        if self.cpu_offload_blocks < 0:
            raise ValueError(f"cpu_offload_blocks must be >= 0, got {self.cpu_offload_blocks}")
        model_len = self.model_config.max_seq_len
        if self.max_model_len is None:
            self.max_model_len = model_len
        if not isinstance(self.max_model_len, int) or not 2 <= self.max_model_len <= model_len:
            raise ValueError(f"max_model_len must be an integer in [2, {model_len}] ({self.model_config.name}'s "
                             f"max_seq_len), got {self.max_model_len!r}")
        if self.num_kv_blocks is None:
            per_seq = -(-self.max_model_len // self.block_size)
            self.num_kv_blocks = per_seq * min(self.max_num_seqs, 16)
        max_blocks = -(-self.max_model_len // self.block_size)
        if self.num_kv_blocks < max_blocks:
            raise ValueError(f"num_kv_blocks={self.num_kv_blocks} cannot hold one max-length sequence "
                             f"({max_blocks} blocks of {self.block_size} tokens for max_model_len="
                             f"{self.max_model_len}); lower max_model_len or raise num_kv_blocks")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def resolved_attention_backend(self) -> str:
        if self.attention_backend != "auto":
            return self.attention_backend
        return "sdpa" if self.device.startswith("cuda") or self.packed_prefill else "flash"

    @property
    def resolved_decode_attention(self) -> str:
        """triton (one fused paged kernel) on a CUDA device with triton installed, else torch."""
        if self.decode_attention != "auto":
            return self.decode_attention
        cuda = self.device.startswith("cuda")
        return "triton" if cuda and importlib.util.find_spec("triton") is not None else "torch"

    def replace(self, **changes: object) -> "EngineConfig":
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
