"""A mixed step's forward with its prefill segments attended one call per segment, or packed into one call
per layer (EngineConfig.packed_prefill, runtime.model.packed_segments), on the same engine and the same step.

The serving profile on the H100 (2026-12-05) put 58% of `serve`'s engine thread in eager mixed steps, 31% in
attention one segment at a time. This times that forward alone, as `serve` builds it: --decodes decoding
requests at --decode-context tokens of context beside --segments prefill chunks of --seg-len tokens, each after
--prefix tokens already in the cache. The step's items are fed to the engine's own ModelRunner.run (the batch
built, the forward run: fused kernels on CUDA, eager as every mixed step is); the KV cache holds whatever it
holds (the times do not depend on its values).

Variants, in blocks of --block-steps forwards between device syncs, the order rotating by round:
    loop       one attention call per segment (the default)
    loop2      the same again: the A/A floor
    packed     one masked SDPA call per layer for all segments (packed kernel "masked")
    varlen     one flash variable-length call per layer (packed kernel "varlen"; where it runs: CUDA, 16-bit)
Reported (measured): per variant, the median over rounds of a block's time per forward, and of its paired ratio
to `loop` in the same round.

    python benchmarks/packed_prefill.py --model llama-1b-shape --device cuda --segments 4 --seg-len 96
    python benchmarks/packed_prefill.py --segments 4 --seg-len 32 --rounds 6     # CPU (tiny-moe)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infersight.runtime import Engine, EngineConfig  # noqa: E402
from infersight.runtime.config import resolve_dtype  # noqa: E402
from infersight.runtime.runner.model_runner import FeedItem  # noqa: E402

VARIANTS = ("loop", "loop2", "packed", "varlen")
#: what each variant sets on the runner: (packed_prefill, packed_kernel)
SETTINGS = {"loop": (False, "masked"), "loop2": (False, "masked"), "packed": (True, "masked"), "varlen": (True, "varlen")}


def _items(engine: Engine, args: argparse.Namespace) -> list[FeedItem]:
    """The step's items, each request on blocks of its own (taken in order from the pool's ids)."""
    bs = engine.config.block_size
    next_block = 0

    def request(context: int) -> SimpleNamespace:
        nonlocal next_block
        n = -(-context // bs)
        table = list(range(next_block, next_block + n))
        next_block += n
        return SimpleNamespace(block_table=table)

    items = [FeedItem(request(args.decode_context), args.decode_context - 1, [7], 1) for _ in range(args.decodes)]
    items += [FeedItem(request(args.prefix + args.seg_len), args.prefix, [11] * args.seg_len, 1)
              for _ in range(args.segments)]
    if next_block > engine.target.k_caches.shape[1]:
        raise SystemExit(f"the step needs {next_block} KV blocks, the engine has {engine.target.k_caches.shape[1]}")
    return items


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-moe")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on CUDA, float32 on the CPU (vLLM's --dtype auto)")
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--seg-len", type=int, default=32)
    p.add_argument("--prefix", type=int, default=0)
    p.add_argument("--decodes", type=int, default=16)
    p.add_argument("--decode-context", type=int, default=128)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--block-steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    args = p.parse_args()
    if args.segments < 2 or args.seg_len < 2:
        p.error("--segments and --seg-len must be >= 2 (a step of one segment is never packed)")
    torch.set_num_threads(args.threads)
    config = EngineConfig(model=args.model, device=args.device, dtype=resolve_dtype(args.dtype, args.device, args.model),
                          packed_prefill=True, max_num_seqs=max(64, args.decodes + args.segments))
    engine = Engine(config)
    runner, items = engine.target, _items(engine, args)
    # the varlen kernel only where it runs (the runner chose it for this device and dtype)
    variants = VARIANTS if runner.packed_kernel == "varlen" else VARIANTS[:3]
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    per_step: dict[str, list[float]] = {v: [] for v in variants}
    ratio: dict[str, list[float]] = {v: [] for v in variants}
    with torch.inference_mode():
        for _ in range(3):  # warm-up: kernels chosen, allocator grown, every variant
            for v in variants:
                runner.packed_prefill, runner.packed_kernel = SETTINGS[v]
                runner.run(items)
        sync()
        for r in range(args.rounds):
            k = r % len(variants)
            order = variants[k:] + variants[:k]
            block: dict[str, float] = {}
            for v in order:
                runner.packed_prefill, runner.packed_kernel = SETTINGS[v]
                sync()
                t0 = time.perf_counter()
                for _ in range(args.block_steps):
                    runner.run(items)
                sync()
                block[v] = (time.perf_counter() - t0) / args.block_steps
            for v in variants:
                per_step[v].append(block[v])
                ratio[v].append(block[v] / block["loop"])
    out = {"measured": True, "how": "wall time of blocks of forwards between device syncs, variants in turn",
           "model": args.model, "device": args.device, "dtype": str(config.torch_dtype), "segments": args.segments,
           "seg_len": args.seg_len, "prefix": args.prefix, "decodes": args.decodes,
           "decode_context": args.decode_context, "rounds": args.rounds, "block_steps": args.block_steps}
    for v in variants:
        ms, x = statistics.median(per_step[v]) * 1e3, statistics.median(ratio[v])
        out[v] = {"ms_per_forward": round(ms, 3), "ratio_to_loop": round(x, 4)}
        print(f"{v:10s} {ms:9.3f} ms a forward   x{x:.3f} of loop (median of {args.rounds} paired rounds)")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
