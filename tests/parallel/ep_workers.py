"""Per-rank functions the expert-parallel tests run through spawn_local, and the shared fixtures'
inputs. Spawned ranks import this module by name (multiprocessing hands them the parent's sys.path)."""
from __future__ import annotations

import contextlib
import itertools
import os
import random
from dataclasses import dataclass
from typing import ContextManager

import torch

from infersight.correlate.frames import EventFrames, update_labels
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime.config import ModelConfig
from infersight.runtime.engine.engine import Engine
from infersight.runtime.model.moe import MoEFFN
from infersight.runtime.parallel.group import EPGroup
from infersight.commands.ep_launch import ep_ring_name
from infersight.runtime.parallel.generation import GenerationSpec, run_generation
from infersight.runtime.parallel.moe import ExpertParallelMoE
from infersight.runtime.parallel.placement import LayerPlacement
from infersight.runtime.parallel.stats import EPLayerStats, EPStatsCollector
from infersight.runtime.ranges import RangeMarker, layer_range_names

TINY = ModelConfig("ep-test-moe", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                   n_experts=4, top_k=2, max_seq_len=128)
_rng = random.Random(7)
PROMPTS: tuple[str | tuple[int, ...], ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Hi",
    *(tuple(_rng.randrange(256) for _ in range(_rng.randrange(3, 60))) for _ in range(6)),
)
# A small token budget forces chunked prefill and mixed prefill/decode steps; block_size 8 pages the KV.
ENGINE_KWARGS = {"block_size": 8, "max_num_batched_tokens": 48, "num_kv_blocks": 256}
SPEC = GenerationSpec(TINY, PROMPTS, max_tokens=24, engine_kwargs=ENGINE_KWARGS)
#: Layer 0 gets two replicas (expert 0 on rank 1, expert 3 on rank 0); layer 1 keeps the home placement.
REPLICATED = {0: LayerPlacement.contiguous(4, 2).with_replicas([(0, 1), (3, 0)])}
_ring_ids = itertools.count()


class RecordingRanges(RangeMarker):
    """Remembers every range name it is asked to mark."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def range(self, name: str) -> ContextManager[None]:
        self.names.add(name)
        return contextlib.nullcontext()


@dataclass
class ProbedRun:
    """What one engine (a rank, or the single-process reference) generated and recorded."""

    tokens: list[list[int]]
    ring_name: str
    frames: EventFrames
    range_names: set[str]


def _probed(ring_name: str) -> tuple[ProbeObserver, RingConsumer]:
    observer = ProbeObserver(ProbeConfig(ring_name=ring_name))
    observer.ranges = RecordingRanges()
    return observer, RingConsumer.attach(ring_name, record_registry())


def _drain(consumer: RingConsumer) -> EventFrames:
    records = consumer.read()
    return EventFrames.from_records(records, update_labels({}, records))


def generate_on_rank(group: EPGroup, spec: GenerationSpec) -> ProbedRun:
    """One rank of an expert-parallel run, probed into its own ring (read back in-process)."""
    observer, consumer = _probed(ep_ring_name("infersight-test-ep", group.rank))
    try:
        result = run_generation(group, spec, observer)
        observer.flush()
        return ProbedRun(result.tokens, observer.ring_name, _drain(consumer), observer.ranges.names)
    finally:
        consumer.close()
        observer.close()


def generate_single(spec: GenerationSpec) -> ProbedRun:
    """The single-process reference: the plain Engine on the same requests, probed the same way."""
    observer, consumer = _probed(f"infersight-test-ref-{os.getpid()}-{next(_ring_ids)}")
    try:
        engine = Engine(spec.engine_config(), observer)
        ids = [engine.add_request(list(p) if isinstance(p, tuple) else p, spec.sampling()) for p in spec.prompts]
        while engine.has_unfinished():
            engine.step()
        observer.flush()
        tokens = [engine.release(rid).token_ids for rid in ids]
        return ProbedRun(tokens, observer.ring_name, _drain(consumer), observer.ranges.names)
    finally:
        consumer.close()
        observer.close()


# -- one MoE layer on its own --------------------------------------------------------------------
LAYER_CFG = ModelConfig("ep-layer", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64,
                        n_experts=4, top_k=2)
#: (dtype, tokens, replicas): token counts below, equal to and above the world size, and odd.
LAYER_CASES = [(dtype, t, reps) for dtype in (torch.float32, torch.bfloat16) for t in (1, 2, 7, 64)
               for reps in ((), ((0, 1), (3, 0)))]


def layer_inputs(dtype: torch.dtype, n_tokens: int) -> tuple[MoEFFN, torch.Tensor]:
    """The same seeded layer and input on every process (the parent recomputes routing from them)."""
    torch.manual_seed(0)
    moe = MoEFFN(LAYER_CFG, RangeMarker(), layer_range_names(0)).to(dtype)
    x = torch.randn(n_tokens, LAYER_CFG.d_model, generator=torch.Generator().manual_seed(n_tokens)).to(dtype)
    return moe, x


@dataclass
class LayerResult:
    dtype: torch.dtype
    n_tokens: int
    replicas: tuple[tuple[int, int], ...]
    reference: torch.Tensor
    output: torch.Tensor
    stats: EPLayerStats
    expert_counts: torch.Tensor


def run_layer_cases(group: EPGroup) -> list[LayerResult]:
    """Every LAYER_CASES case: the dense MoEFFN and its expert-parallel version on the same input."""
    out = []
    for dtype, n_tokens, replicas in LAYER_CASES:
        moe, x = layer_inputs(dtype, n_tokens)
        placement = LayerPlacement.contiguous(LAYER_CFG.n_experts, group.world).with_replicas(replicas)
        collector = EPStatsCollector(group.rank, group.world, "cpu")
        counts = torch.zeros(LAYER_CFG.n_experts, dtype=torch.long)
        with torch.inference_mode():
            reference = moe(x)
            ep = ExpertParallelMoE(moe, 0, group, placement, collector, RangeMarker())
            output = ep(x, counts)
        (stats,) = collector.flush(1, None)
        out.append(LayerResult(dtype, n_tokens, replicas, reference, output, stats, counts))
    return out


# -- one rank's model, built alone ---------------------------------------------------------------
#: Experts dominate it (2 layers x 8 experts x 3 x 256 x 2048 fp32 = 100.7 MB; the rest ~1 MB), so
#: a process's peak RSS tells a rank's share from the full model.
BIG_EXPERTS = ModelConfig("ep-local-rss", d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=2048,
                          n_experts=8, top_k=2, max_seq_len=64)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def build_peak_rss(world: int, rank: int | None) -> tuple[int, int]:
    """In a fresh process: (parameter bytes, peak RSS growth in bytes) of building BIG_EXPERTS for
    `rank` of `world` (rank None: the full single-process model). The peak is the kernel's VmHWM,
    reset just before the build (clear_refs 5), minus the RSS then."""
    from infersight.runtime.config import EngineConfig
    from infersight.runtime.parallel.local_model import build_local_model
    from infersight.runtime.model.weights import build_model

    torch.set_num_threads(1)
    # Both builds once on a tiny model first: the lazy imports and kernel loads of a first build
    # (about 150 MB here) must not count as the model's.
    build_model(TINY, dtype=torch.float32, device="cpu", seed=0)
    build_local_model(EngineConfig(model=TINY, device="cpu"), EPGroup(0, 2, "cpu"), EPStatsCollector(0, 2, "cpu"),
                      RangeMarker())
    config = EngineConfig(model=BIG_EXPERTS, device="cpu", dtype="float32", seed=3)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = _status_kib("VmRSS")
    if rank is None:
        model = build_model(BIG_EXPERTS, dtype=torch.float32, device="cpu", seed=3)
    else:
        group = EPGroup(rank, world, "cpu")  # building needs no collective: no process group
        model = build_local_model(config, group, EPStatsCollector(rank, world, "cpu"), RangeMarker())
    after = _status_kib("VmHWM")
    return sum(p.numel() * p.element_size() for p in model.parameters()), (after - before) * 1024


# -- rings the sidecar reads after the ranks exit -------------------------------------------------
def generate_keeping_ring(group: EPGroup, spec: GenerationSpec, prefix: str) -> tuple[list[list[int]], str]:
    """One rank of an expert-parallel run, probed into its own ring, which stays in /dev/shm after
    this rank exits (the test's parent reads every rank's ring as the agent would, then removes it)."""
    observer = ProbeObserver(ProbeConfig(ring_name=ep_ring_name(prefix, group.rank)))
    try:
        result = run_generation(group, spec, observer)
    finally:
        observer.close(unlink=False)
    return result.tokens, observer.ring_name


def generate_runs_keeping_rings(group: EPGroup, runs: list[tuple[str, int, GenerationSpec]]
                                ) -> list[tuple[list[list[int]], str] | None]:
    """Several runs in the same W processes (their start-up is most of a CPU test's time):
    runs[i] = (ring prefix, world, spec). A world below group.world runs on the first `world`
    ranks, a gloo subgroup; the other ranks skip it (None)."""
    import torch.distributed as dist

    out: list[tuple[list[list[int]], str] | None] = []
    for prefix, world, spec in runs:
        sub = group
        if world != group.world:
            pg = dist.new_group(list(range(world)))  # every rank takes part in creating it
            sub = EPGroup(group.rank, world, group.device, pg)
        out.append(generate_keeping_ring(sub, spec, prefix) if group.rank < world else None)
        dist.barrier()
    return out
