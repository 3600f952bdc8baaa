"""torchrun entry point: one expert-parallel engine per rank, the same greedy requests on every rank.

    torchrun --nproc-per-node 2 -m infersight.commands.ep_launch --model tiny-moe --prompts 8

Rank 0 prints `key: value` lines and then one JSON object as its last line (like `infersight
bench`): whether every rank generated the same tokens, the tokens' digest, and per-rank totals of
the expert-parallel stats. With --probes each rank writes its events to its own ring
(`<ring-prefix>-r<rank>-<pid>`); `infersight agent --discover` merges them.

(Not a subcommand: torchrun starts one process per rank with this module. The generation itself is
runtime.parallel.generation's; this module adds the probes, which the runtime may not import.)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Sequence

import torch
import torch.distributed as dist

from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime.config import ModelConfig, resolve_model
from infersight.runtime.parallel.generation import (GenerationSpec, RankResult, run_generation, seeded_prompts,
                                                    tokens_digest)
from infersight.runtime.parallel.group import init_from_env


def ep_ring_name(prefix: str, rank: int) -> str:
    """The probe ring of one rank: the rank is in the name, the pid keeps runs apart."""
    return f"{prefix}-r{rank}-{os.getpid()}"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m infersight.commands.ep_launch", description=__doc__,
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
