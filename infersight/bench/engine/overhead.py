"""`infersight bench overhead`: what the probes cost the engine, measured in one process.

One engine in steady decode; before each step a switch picks what observes it, rotating through
probes off, NVTX ranges only, and all probes (NVTX + semantic events into the ring, drained
between steps outside the timing). Drift in the machine's speed hits all three alike.
Reported: median step time of each, the ratios to "off", events per step, and the cost of one
event measured directly (a tight loop of record writes).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from infersight.bench.engine.switch import SwitchObserver
from infersight.bench.engine.timing import sync
from infersight.probes.config import ProbeConfig
from infersight.probes.nvtx import NvtxRanges
from infersight.probes.observer import ProbeObserver, make_observer
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import Engine, EngineConfig, SamplingParams


@dataclass
class OverheadResult:
    model: str
    device: str
    batch: int
    steps: int
    step_ms_off: float
    step_ms_nvtx: float
    step_ms_all: float
    ratio_nvtx: float
    ratio_all_probes: float
    events_per_step: float
    ns_per_event: float
    nvtx_backend: str
    dropped: int



def bench_overhead(model: str = "tiny-moe", device: str = "cpu", dtype: str = "float32", batch: int = 16,
                   prompt_len: int = 64, steps: int = 200, seed: int = 0) -> OverheadResult:
    config = EngineConfig(model=model, device=device, dtype=dtype, seed=seed, max_num_seqs=batch,
                          max_num_batched_tokens=max(512, batch * prompt_len))
    name = f"infersight-bench-{time.monotonic_ns()}"
    probe = ProbeObserver(ProbeConfig(ring_name=name))
    switch = SwitchObserver({"off": make_observer(None), "nvtx": make_observer(ProbeConfig(events=False)),
                             "all": probe}, initial="all")
    engine = Engine(config, switch)
    consumer = RingConsumer.attach(probe.ring_name, record_registry())
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (prompt_len,), generator=gen).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=3 * steps + 8, ignore_eos=True)
    for p in prompts:
        engine.add_request(p, params)
    engine.step()  # prefill; everything after is a decode step
    engine.step()
    consumer.read()
    order = ["off", "nvtx", "all"]
    times: dict[str, list[float]] = {k: [] for k in order}
    produced_by_all = 0
    for i in range(steps):
        for k in order[i % 3:] + order[:i % 3]:  # rotate who goes first
            switch.select(k)
            before = consumer.stats()["produced"]
            sync(device)
            t0 = time.perf_counter_ns()
            engine.step()
            sync(device)
            times[k].append(time.perf_counter_ns() - t0)
            consumer.read()
            if k == "all":
                produced_by_all += consumer.stats()["produced"] - before
    stats = consumer.stats()
    events_per_step = produced_by_all / steps
    med = {k: statistics.median(v) for k, v in times.items()}
    result = OverheadResult(
        model=model, device=device, batch=batch, steps=steps,
        step_ms_off=round(med["off"] / 1e6, 4), step_ms_nvtx=round(med["nvtx"] / 1e6, 4),
        step_ms_all=round(med["all"] / 1e6, 4), ratio_nvtx=round(med["nvtx"] / med["off"], 4),
        ratio_all_probes=round(med["all"] / med["off"], 4), events_per_step=round(events_per_step, 1),
        ns_per_event=round(_event_cost_ns(probe, consumer), 1),
        nvtx_backend=probe.ranges.backend.name if isinstance(probe.ranges, NvtxRanges) else "none",
        dropped=stats["dropped"])
    consumer.close()
    probe.close()
    return result


def _event_cost_ns(probe: ProbeObserver, consumer: RingConsumer, n: int = 20000) -> float:
    """Median over 5 rounds of the cost of one request record (pack + ring write)."""
    rounds = []
    for _ in range(5):
        consumer.read()
        t0 = time.perf_counter_ns()
        for i in range(n):
            probe.on_tokens_emitted(0, i, 1)
        rounds.append((time.perf_counter_ns() - t0) / n)
    consumer.read()
    return statistics.median(rounds)


def as_dict(result: OverheadResult) -> dict[str, object]:
    return asdict(result)
