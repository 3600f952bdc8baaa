"""torchrun entry point: one expert-parallel engine per rank, the same greedy requests on every rank.

    torchrun --nproc-per-node 2 -m infersight.runtime.parallel.launch --model tiny-moe --prompts 8

Rank 0 prints `key: value` lines and then one JSON object as its last line (like `infersight
bench`): whether every rank generated the same tokens, the tokens' digest, and per-rank totals of
the expert-parallel stats. With --probes each rank writes its events to its own ring
(`<ring-prefix>-r<rank>-<pid>`); `infersight agent --discover` merges them.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
import torch.distributed as dist

from infersight.runtime.config import EngineConfig, ModelConfig, resolve_model
from infersight.runtime.observer import EngineObserver
from infersight.runtime.parallel.engine import ExpertParallelEngine
from infersight.runtime.parallel.group import EPGroup, init_from_env
from infersight.runtime.parallel.placement import LayerPlacement
from infersight.runtime.parallel.stats import EPLayerStats
from infersight.runtime.sampling import SamplingParams


def ep_ring_name(prefix: str, rank: int) -> str:
    """The probe ring of one rank: the rank is in the name, the pid keeps runs apart."""
    return f"{prefix}-r{rank}-{os.getpid()}"


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


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m infersight.runtime.parallel.launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--layers", type=int, default=None, help="override the model's layer count")
    ap.add_argument("--device", default="auto", help="auto (cuda:LOCAL_RANK when available), cpu or cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank on CPU")
    ap.add_argument("--probes", action="store_true", help="write each rank's events to its own ring")
    ap.add_argument("--ring-prefix", default="infersight-ep")
    ap.add_argument("--linger-s", type=float, default=0.0, help="keep the rings this long after the run")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    group = init_from_env(args.device)
    if group.device == "cpu":
        torch.set_num_threads(args.threads)
    model = resolve_model(args.model)
    if args.layers is not None and args.layers != model.n_layers:
        # renamed: a shipped weights file of the full-depth model would not fit (random init instead)
        model = dataclasses.replace(model, name=f"{model.name}-{args.layers}l", n_layers=args.layers)
    spec = GenerationSpec(model, seeded_prompts(args.prompts, args.prompt_len, args.seed), args.max_tokens,
                          device=group.device, dtype=args.dtype, seed=args.seed)
    observer = None
    if args.probes:
        from infersight.probes.config import ProbeConfig  # the probes observe the runtime: imported on demand
        from infersight.probes.observer import ProbeObserver
        observer = ProbeObserver(ProbeConfig(ring_name=ep_ring_name(args.ring_prefix, group.rank)))
    try:
        result = run_generation(group, spec, observer)
        gathered: list[RankResult | None] = [None] * group.world
        dist.all_gather_object(gathered, result)
        if args.linger_s > 0:
            time.sleep(args.linger_s)
    finally:
        if observer is not None:
            observer.close()
    if group.rank == 0:
        _report([r for r in gathered if r is not None], spec)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _report(results: list[RankResult], spec: GenerationSpec) -> None:
    identical = all(r.tokens == results[0].tokens for r in results)
    summary: dict[str, object] = {
        "model": spec.model.name if isinstance(spec.model, ModelConfig) else spec.model, "world": len(results),
        "device": spec.device, "dtype": spec.dtype, "requests": len(spec.prompts),
        "tokens_identical_across_ranks": identical, "tokens_digest": tokens_digest(results[0].tokens),
        "generated_tokens": sum(len(t) for t in results[0].tokens), "elapsed_s": round(results[0].elapsed_s, 3),
    }
    for r in results:
        t = r.totals
        moe = max(t.total_ns, 1)
        summary[f"rank{r.rank}"] = {
            "dispatch_ms": t.dispatch_ns / 1e6, "compute_ms": t.compute_ns / 1e6, "combine_ms": t.combine_ns / 1e6,
            "gather_ms": t.gather_ns / 1e6, "moe_ms": t.total_ns / 1e6,
            "a2a_share": round((t.dispatch_ns + t.combine_ns) / moe, 4), "bytes_to_peer": t.bytes_to_peer,
            "tokens_received": sum(t.expert_tokens.values())}
    for key, value in summary.items():
        print(f"{key}: {value}")
    print(json.dumps(summary))
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
