"""mixtral-shape engine decode at batch 16 on the GPU, ms/step, with the MoE expert paths
interleaved in one engine (same process, same requests, rounds alternating between paths).

    python3 benchmarks/moe_engine_decode.py [--paths auto,grouped,padded] [--rounds 3] [--steps 8]

Eager engine steps (Engine.step, CUDA-synchronised before and after each), prompts of 256 random
tokens, greedy. A tree without MoEFFN.expert_path (an older commit) runs "auto" only. Prints one
JSON line per path: the median step over all its rounds, and the roofline of the touched experts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from infersight.kernels.ceilings.ceiling_lookup import lookup_ceilings
from infersight.runtime import Engine, EngineConfig, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--paths", default="auto,grouped,padded")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    paths = args.paths.split(",")
    prompt_len, total = 256, args.rounds * len(paths) * (args.steps + 1) + 4
    config = EngineConfig(model="mixtral-shape", device="cuda", dtype="bfloat16", seed=0,
                          enable_prefix_caching=False, max_num_seqs=args.batch,
                          max_num_batched_tokens=args.batch * prompt_len,
                          num_kv_blocks=args.batch * -(-(prompt_len + total) // 16) + 64)
    engine = Engine(config)
    gen = torch.Generator().manual_seed(0)
    for _ in range(args.batch):
        engine.add_request(torch.randint(0, 256, (prompt_len,), generator=gen).tolist(),
                           SamplingParams(temperature=0, max_tokens=total, ignore_eos=True))
    engine.step()  # prefill
    layers = [layer.ffn for layer in engine.target.model.layers]
    times: dict[str, list[float]] = {p: [] for p in paths}
    for _ in range(args.rounds):
        for path in paths:
            for ffn in layers:
                ffn.expert_path = None if path == "auto" else path
            engine.step()  # warm-up after a switch
            for _ in range(args.steps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                stats = engine.step()
                torch.cuda.synchronize()
                assert stats.num_decode_tokens == args.batch
                times[path].append(time.perf_counter() - t0)
    cfg = config.model_config
    # The copy bandwidth `infersight bench ceilings` measured and cached, else the datasheet's (named below).
    ceiling = lookup_ceilings(torch.cuda.get_device_name(), "bfloat16", given_as=None)
    gbps = ceiling.ceilings.peak_gbps if ceiling.ceilings else float("nan")
    roof_ms = cfg.n_layers * cfg.n_experts * 3 * cfg.d_model * cfg.ffn_dim * 2 / (gbps * 1e9) * 1e3
    for path, t in times.items():
        med = statistics.median(t) * 1e3
        print(json.dumps({"path": path, "batch": args.batch, "decode_step_ms": round(med, 2),
                          "min_ms": round(min(t) * 1e3, 2), "steps": len(t),
                          "all_experts_roofline_ms": round(roof_ms, 2),
                          "pct_of_roofline": round(100 * roof_ms / med, 1),
                          "copy_ceiling": ceiling.bandwidth_said()}), flush=True)


if __name__ == "__main__":
    main()
