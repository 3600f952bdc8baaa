"""Expert-parallel generation on one rank: the same engine config and greedy requests on every
rank, and what the rank reports (its tokens and the sums of its expert-parallel stats).

The torchrun entry point that runs it (with probes when asked) is infersight.commands.ep_launch:
the probes observe the runtime, so the runtime does not import them.
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch.distributed as dist

from infersight.runtime.config import EngineConfig, ModelConfig
from infersight.runtime.observer import EngineObserver
from infersight.runtime.parallel.engine import ExpertParallelEngine
from infersight.runtime.parallel.group import EPGroup
from infersight.runtime.parallel.placement import LayerPlacement
from infersight.runtime.parallel.stats import EPLayerStats
from infersight.runtime.engine.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationSpec:
    """What every rank runs: the same engine config and the same greedy requests."""

    model: str | ModelConfig
    prompts: tuple[str | tuple[int, ...], ...]
    max_tokens: int
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    engine_kwargs: Mapping[str, object] = field(default_factory=dict)
    placements: Mapping[int, LayerPlacement] | None = None

    def engine_config(self, device: str | None = None) -> EngineConfig:
        return EngineConfig(model=self.model, device=device or self.device, dtype=self.dtype, seed=self.seed,
                            **self.engine_kwargs)  # type: ignore[arg-type]

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=self.max_tokens, ignore_eos=True)


@dataclass
class RankTotals:
    """Sums of one rank's EPLayerStats over a run."""

    steps: int = 0
    dispatch_ns: int = 0
    compute_ns: int = 0
    combine_ns: int = 0
    gather_ns: int = 0
    total_ns: int = 0
    bytes_to_peer: list[int] = field(default_factory=list)
    expert_tokens: dict[int, int] = field(default_factory=dict)  # global expert id -> tokens received

    def add(self, stats: Sequence[EPLayerStats]) -> None:
        self.steps += 1 if stats else 0
        for s in stats:
            self.dispatch_ns += s.dispatch_ns
            self.compute_ns += s.compute_ns
            self.combine_ns += s.combine_ns
            self.gather_ns += s.gather_ns
            self.total_ns += s.total_ns
            if len(self.bytes_to_peer) < len(s.bytes_to_peer):
                self.bytes_to_peer += [0] * (len(s.bytes_to_peer) - len(self.bytes_to_peer))
            for p, b in enumerate(s.bytes_to_peer):
                self.bytes_to_peer[p] += b
            for e, n in zip(s.expert_ids, s.expert_tokens):
                self.expert_tokens[e] = self.expert_tokens.get(e, 0) + n


@dataclass
class RankResult:
    rank: int
    world: int
    tokens: list[list[int]]
    totals: RankTotals
    elapsed_s: float


def run_generation(group: EPGroup, spec: GenerationSpec, observer: EngineObserver | None = None) -> RankResult:
    """Generate spec's prompts on this rank's expert-parallel engine; every rank must call it."""
    engine = ExpertParallelEngine(spec.engine_config(group.device if spec.device == "auto" else None), group,
                                  observer, spec.placements)
    params = spec.sampling()
    ids = [engine.add_request(list(p) if isinstance(p, tuple) else p, params) for p in spec.prompts]
    totals = RankTotals()
    dist.barrier(group.group)  # ranks finish building at different times; keep that out of step 1's dispatch
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        totals.add(engine.last_ep_stats)
    elapsed = time.perf_counter() - start
    tokens = [engine.release(rid).token_ids for rid in ids]
    return RankResult(group.rank, group.world, tokens, totals, elapsed)


def seeded_prompts(n: int, length: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """n byte prompts of `length` tokens, the same on every rank (same seed)."""
    rng = random.Random(seed)
    return tuple(tuple(rng.randrange(256) for _ in range(length)) for _ in range(n))


def tokens_digest(tokens: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]
