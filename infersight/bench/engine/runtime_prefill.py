"""`infersight bench runtime --prefill-len N`: one long prompt prefilled in one step, in TFLOP/s.

The prompt of N tokens is fed as one chunk (max_num_batched_tokens = N, prefix cache off), timed
as a whole engine step between device syncs and, separately, as the forward's device time (the
engine's CUDA events). TFLOP/s are MODELLED: the FLOPs come from the shape, not from a counter:

    matmuls    2 * N * n_layers * (attention + FFN weights the tokens use) + 2 * d * vocab (one logits row)
    attention  4 * n_layers * (n_heads * head_dim) * N * (N + 1) / 2 (QK^T and PV over the causal triangle)

divided by the measured time, and shared against the device's dense GEMM ceiling at the dtype:
measured by `infersight bench ceilings` when cached, else the datasheet's, else none (share None);
gemm_ceiling names it and its source (kernels.ceilings.ceiling_lookup). A model whose max_seq_len is below N + 2
gets a longer RoPE table for this run only (max_seq_len_raised says so); the weights are the same.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

import torch

from infersight.bench.engine.timing import timed_step
from infersight.runtime import Engine, EngineConfig, SamplingParams
from infersight.runtime.model.model_config import ModelConfig, resolve_model


@dataclass
class LongPrefillResult:
    """The median of `repeats` timed prefills (after one warm-up)."""

    tokens: int
    step_ms: float
    forward_ms: float | None       # device time of the forward (CUDA events); None on the CPU
    modelled_tflop: float
    modelled_tflops: float         # modelled FLOPs / forward time (step time on the CPU)
    share_of_gemm_ceiling: float | None  # None: no ceiling known for the device (gemm_ceiling says why)
    max_seq_len_raised: bool
    gemm_ceiling: str = ""               # the ceiling shared against and its source (measured / datasheet)


def prefill_flops(cfg: ModelConfig, tokens: int) -> float:
    """The modelled FLOPs of one prefill of `tokens` tokens from an empty cache (module docstring)."""
    from infersight.kernels.analysis.roofline import StepShape, analytic_work

    work = analytic_work(cfg, StepShape("prefill", 1, tokens, tokens))
    matmuls = float(work.loc[work["op_category"] == "GEMM", "flops"].sum())
    attention = 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * tokens * (tokens + 1) / 2
    return matmuls + attention


def bench_long_prefill(model: str, device: str, dtype: str, tokens: int, repeats: int = 3, seed: int = 0,
                       decode_attention: str = "auto", compile_layers: bool = False, fused_forward: bool = True
                       ) -> LongPrefillResult:
    """Prefill one `tokens`-token prompt `repeats` times after a warm-up; see the module docstring."""
    from infersight.kernels.ceilings.ceiling_cache import host_cpu_name
    from infersight.kernels.ceilings.ceiling_lookup import lookup_ceilings

    if tokens < 2 or repeats < 1:
        raise ValueError("prefill_len must be >= 2 and repeats >= 1")
    cfg = resolve_model(model)
    raised = cfg.max_seq_len < tokens + 2
    if raised:
        cfg = dataclasses.replace(cfg, max_seq_len=tokens + 2)
    block = 16
    config = EngineConfig(model=cfg, device=device, dtype=dtype, seed=seed, enable_prefix_caching=False,
                          decode_attention=decode_attention, max_num_seqs=1, max_num_batched_tokens=tokens,
                          block_size=block, max_model_len=tokens + 2, num_kv_blocks=-(-(tokens + 2) // block) + 4,
                          compile_layers=compile_layers, fused_forward=fused_forward)
    engine = Engine(config)
    gen = torch.Generator().manual_seed(seed)
    walls, forwards = [], []
    for i in range(repeats + 1):
        prompt = torch.randint(0, min(cfg.vocab_size, 256), (tokens,), generator=gen).tolist()
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        stats, wall = timed_step(engine, device)
        if stats.num_prefill_tokens != tokens:
            raise RuntimeError(f"the prompt was not prefilled in one step ({stats.num_prefill_tokens} of {tokens})")
        while engine.has_unfinished():
            engine.step()
        if i:
            walls.append(wall)
            if stats.target_ns > 0 and device.startswith("cuda"):
                forwards.append(stats.target_ns / 1e9)
    flop = prefill_flops(cfg, tokens)
    step_s = statistics.median(walls)
    forward_s = statistics.median(forwards) if forwards else None
    tflops = flop / (forward_s or step_s) / 1e12
    del engine
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    ceiling = lookup_ceilings(torch.cuda.get_device_name(device) if device.startswith("cuda") else host_cpu_name(),
                              dtype, given_as=None)
    share = _sig(tflops / ceiling.ceilings.peak_tflops) if ceiling.ceilings is not None else None
    return LongPrefillResult(tokens, round(step_s * 1e3, 3), round(forward_s * 1e3, 3) if forward_s else None,
                             _sig(flop / 1e12), _sig(tflops), share, raised, ceiling.compute_said())


def _sig(x: float) -> float:
    """x to 4 significant digits (a tiny CPU model's TFLOP/s would round to 0 at fixed decimals)."""
    return float(f"{x:.4g}")
