"""The engine's prefix-cache commit (KVCacheManager.commit) over whole request lives, as `serve` drives it:
a prompt prefilled in one step, then one token a step, commit after every step. Host time only (no model).

The serving profile on the H100 (12-05) put 3.9% of `serve`'s engine thread in KV block hashes. Run it on two
trees to compare (the commit's code is all that differs), alternating, e.g.:

    for i in 1 2 3; do for t in /tmp/before .; do (cd $t && python benchmarks/kv_commit_cost.py); done; done

Reported (measured, wall clock of the commit calls alone): median over --rounds of the commit time per request.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infersight.runtime.config import EngineConfig  # noqa: E402
from infersight.runtime.engine.request import Request  # noqa: E402
from infersight.runtime.engine.sampling import SamplingParams  # noqa: E402
from infersight.runtime.kv.kv_cache import KVCacheManager  # noqa: E402
from infersight.runtime.observer import EngineObserver  # noqa: E402


def one_round(kv: KVCacheManager, rng: random.Random, requests: int, prompt: tuple[int, int], output: int) -> float:
    """Seconds spent in commit for `requests` request lives, one after another (each freed at its end)."""
    spent = 0.0
    for rid in range(requests):
        # `serve`'s prompts of 32-400 characters are 32-400 byte tokens; distinct, so nothing is a prefix hit
        tokens = [rng.randrange(256) for _ in range(rng.randint(*prompt))]
        req = Request(rid, tokens, SamplingParams(max_tokens=output), torch.Generator(), 0)
        kv.allocate_slots(req, len(tokens))
        req.num_computed = req.draft_computed = len(tokens)
        req.output_token_ids.append(rng.randrange(256))
        t0 = time.perf_counter()
        kv.commit(req)
        spent += time.perf_counter() - t0
        for _ in range(output - 1):  # one decode step: the last token's KV computed, a new token out
            kv.allocate_slots(req, 1)
            req.num_computed += 1
            req.draft_computed = req.num_computed
            req.output_token_ids.append(rng.randrange(256))
            t0 = time.perf_counter()
            kv.commit(req)
            spent += time.perf_counter() - t0
        kv.free(req)
    return spent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--prompt", type=int, nargs=2, default=(32, 400), metavar=("MIN", "MAX"))
    p.add_argument("--output", type=int, default=96)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    config = EngineConfig(model="tiny-moe", device="cpu", block_size=args.block_size, num_kv_blocks=4096)
    kv = KVCacheManager(config, EngineObserver())
    rng = random.Random(args.seed)
    one_round(kv, rng, 20, tuple(args.prompt), args.output)  # warm-up
    per_request = [one_round(kv, rng, args.requests, tuple(args.prompt), args.output) / args.requests
                   for _ in range(args.rounds)]
    us = statistics.median(per_request) * 1e6
    print(f"commit: {us:.1f} us a request (median of {args.rounds} rounds of {args.requests}; "
          f"prompts {args.prompt[0]}-{args.prompt[1]}, {args.output} output tokens, block {args.block_size})")
    print(json.dumps({"measured": True, "how": "perf_counter around each commit call", "us_per_request": round(us, 2),
                      "rounds_us": [round(x * 1e6, 2) for x in per_request]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
