"""The Hugging Face transformers anchor for `bench runtime`: the same dense shape, random weights,
greedy decode through `generate`, timed per step.

A logits processor records a clock after each forward (with a device sync on CUDA; generate's
stopping check syncs every step anyway), so the step time is the median interval between
consecutive decode steps, the prefill excluded. Two modes: "eager" (the default dynamic cache)
and "static-compile" (cache_implementation="static", which transformers compiles for decoding
on CUDA). Only dense models: transformers is imported here and nowhere in the runtime.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from infersight.runtime.model.model_config import ModelConfig


def hf_model(cfg: ModelConfig, dtype: torch.dtype, device: str) -> Any:
    """A LlamaForCausalLM of cfg's shape with random weights, built straight on the device."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if cfg.is_moe:
        raise ValueError(f"{cfg.name}: the transformers anchor covers dense models only")
    config = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_dim,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=cfg.max_seq_len,
                         rms_norm_eps=cfg.norm_eps, tie_word_embeddings=False, bos_token_id=None,
                         eos_token_id=None, pad_token_id=0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


class _StepClock:
    """A LogitsProcessor that leaves the scores alone and notes when each step's logits exist."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.cuda:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        return scores


def hf_decode_step_ms(model: Any, batch: int, prompt_len: int, steps: int, mode: str = "eager",
                      seed: int = 0, repeats: int = 2) -> float:
    """Median ms per greedy decode step of `model` at this batch and prompt length."""
    from transformers import LogitsProcessorList

    if mode not in ("eager", "static-compile"):
        raise ValueError(f"mode must be eager or static-compile, got {mode!r}")
    device = str(model.device)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=gen).to(device)
    extra = {"cache_implementation": "static"} if mode == "static-compile" else {}
    intervals: list[float] = []
    for i in range(repeats + 1):  # the first run warms up (and compiles, for static-compile)
        clock = _StepClock(device)
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, min_new_tokens=steps,
                           do_sample=False, pad_token_id=0, logits_processor=LogitsProcessorList([clock]), **extra)
        if i:
            intervals += [b - a for a, b in zip(clock.times, clock.times[1:])]
    return round(1000 * statistics.median(intervals), 3)
