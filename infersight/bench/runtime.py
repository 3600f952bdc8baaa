"""`infersight bench runtime`: prefill and decode tokens/s of the reference runtime.

Prefill: a batch of prompts fed through one step each (max_tokens=1, prefix cache off).
Decode: a batch of requests already past prefill; the median of per-step decode tokens/s.
"""
from __future__ import annotations

import platform
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from infersight.bench.timing import sync
from infersight.runtime import Engine, EngineConfig, SamplingParams


@dataclass
class RuntimeBenchResult:
    model: str
    device: str
    dtype: str
    decode_attention: str
    batch: int
    prompt_len: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    decode_step_ms: float
    machine: str



def bench_runtime(model: str = "tiny-moe", device: str = "cpu", dtype: str = "float32", batch: int = 16,
                  prompt_len: int = 128, decode_steps: int = 32, repeats: int = 3, seed: int = 0,
                  decode_attention: str = "auto") -> RuntimeBenchResult:
    budget = batch * prompt_len
    config = EngineConfig(model=model, device=device, dtype=dtype, seed=seed, enable_prefix_caching=False,
                          decode_attention=decode_attention,
                          max_num_seqs=batch, max_num_batched_tokens=budget,
                          num_kv_blocks=batch * (-(-(prompt_len + decode_steps + 2) // 16)) + 64)
    engine = Engine(config)
    gen = torch.Generator().manual_seed(seed)

    def prompts() -> list[list[int]]:
        return [torch.randint(0, 256, (prompt_len,), generator=gen).tolist() for _ in range(batch)]

    def drain() -> None:
        while engine.has_unfinished():
            engine.step()

    # Warm-up once, then time whole prefill steps (every request prefills in one step).
    prefill_rates = []
    for i in range(repeats + 1):
        for p in prompts():
            engine.add_request(p, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        sync(device)
        t0 = time.perf_counter()
        stats = engine.step()
        sync(device)
        dt = time.perf_counter() - t0
        drain()
        if i:
            prefill_rates.append(stats.num_prefill_tokens / dt)
    for p in prompts():
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=decode_steps + 2, ignore_eos=True))
    engine.step()  # prefill
    step_times = []
    for _ in range(decode_steps):
        sync(device)
        t0 = time.perf_counter()
        stats = engine.step()
        sync(device)
        step_times.append((time.perf_counter() - t0, stats.num_decode_tokens))
    drain()
    decode_rates = [n / dt for dt, n in step_times[1:] if n]
    machine = f"{platform.machine()} {torch.get_num_threads()} threads"
    if device.startswith("cuda"):
        machine = torch.cuda.get_device_name()
    return RuntimeBenchResult(model, device, dtype, engine.decode_attention, batch, prompt_len,
                              round(statistics.median(prefill_rates), 1), round(statistics.median(decode_rates), 1),
                              round(1000 * statistics.median(dt for dt, _ in step_times[1:]), 3), machine)


def as_dict(result: RuntimeBenchResult) -> dict[str, object]:
    return asdict(result)
