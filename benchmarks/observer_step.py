"""What an attached observer adds to a whole decode step of a small MoE engine, by engine: the same
decode batch on engines built alike but for their observer, stepped in blocks in turn.

`bench speculation --demo-workload` on an H100 (2026-12-05) timed tiny-moe's plain decode step at batch 1 at
0.45 ms on an engine without an observer, and its plain probe steps at 0.75 ms on the demo's engine, which has
the ProbeObserver; the spec arm's steps were ~0.25 ms longer with it too. probe_cost.py switches observers on
one engine, so both its variants count experts (Engine decides that at construction): it cannot see this.

Variants (one engine each; the same requests, greedy, each engine its own KV):
    none       EngineObserver (nothing observes)
    none2      the same again: the A/A floor
    probes     ProbeObserver as `infersight demo` and `serve` attach it (expert counts on)
    no_counts  ProbeObserver with ProbeConfig(expert_counts=False)

Each round runs one block of --block-steps decode steps per variant, in an order rotating from round to round;
a block's time is the wall time between two device syncs. Rings are drained between blocks, outside the time.
Reported (measured): per variant, the median over rounds of its block's time per step, and of the paired ratio
to `none`'s block in the same round.

    python benchmarks/observer_step.py --device cuda --dtype bfloat16 --batch 1 --rounds 40
    python benchmarks/observer_step.py --batch 2 --rounds 6 --block-steps 4        # CPU smoke run
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infersight.probes.config import ProbeConfig  # noqa: E402
from infersight.probes.observer import ProbeObserver  # noqa: E402
from infersight.probes.records import record_registry  # noqa: E402
from infersight.probes.ring import RingConsumer  # noqa: E402
from infersight.runtime import Engine, EngineConfig, SamplingParams  # noqa: E402
from infersight.runtime.config import resolve_dtype  # noqa: E402

VARIANTS = ("none", "none2", "probes", "no_counts")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-moe")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on CUDA, float32 on the CPU (vLLM's --dtype auto)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--block-steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--profile", action="store_true",
                   help="also cProfile every variant's blocks: the functions whose own time per step exceeds none's most")
    args = p.parse_args()
    steps_needed = args.rounds * args.block_steps + 16
    config = EngineConfig(model=args.model, device=args.device, dtype=resolve_dtype(args.dtype, args.device, args.model), max_num_seqs=max(args.batch, 1),
                          max_model_len=args.prompt_len + steps_needed + 16)
    observers, consumers = {}, []
    for name in VARIANTS:
        if name.startswith("none"):
            observers[name] = None
            continue
        obs = ProbeObserver(ProbeConfig(ring_name=f"infersight-observer-step-{name}-{time.monotonic_ns()}",
                                        nvtx=False, expert_counts=name == "probes"))
        observers[name] = obs
        consumers.append(RingConsumer.attach(obs.ring_name, record_registry()))
    engines = {name: Engine(config, obs) for name, obs in observers.items()}
    try:
        for engine in engines.values():
            engine.capture_decode_graphs()
            for i in range(args.batch):
                engine.add_request([3 + (i + k) % 200 for k in range(args.prompt_len)],
                                   SamplingParams(temperature=0.0, max_tokens=steps_needed, ignore_eos=True))
            for _ in range(8):  # prefill and the first decode steps, untimed
                engine.step()
        profiles = {n: cProfile.Profile() for n in VARIANTS} if args.profile else {}
        per_step: dict[str, list[float]] = {n: [] for n in VARIANTS}
        ratio: dict[str, list[float]] = {n: [] for n in VARIANTS}
        for r in range(args.rounds):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            block = {}
            for name in order:
                engine = engines[name]
                _sync(args.device)
                if profiles:
                    profiles[name].enable()
                t0 = time.perf_counter_ns()
                for _ in range(args.block_steps):
                    engine.step()
                _sync(args.device)
                if profiles:
                    profiles[name].disable()
                block[name] = (time.perf_counter_ns() - t0) / args.block_steps / 1e3
                for c in consumers:
                    c.read()
            for name in VARIANTS:
                per_step[name].append(block[name])
                ratio[name].append(block[name] / block["none"])
        out = {"measured": True, "how": "wall time of blocks of decode steps between device syncs, variants in turn",
               "model": args.model, "device": args.device, "dtype": str(config.torch_dtype), "batch": args.batch,
               "rounds": args.rounds, "block_steps": args.block_steps,
               "graph_blocker": {n: e.target.graph_blocker for n, e in engines.items()}}
        for name in VARIANTS:
            us, rt = statistics.median(per_step[name]), statistics.median(ratio[name])
            print(f"{name:10s} {us:9.1f} us a step   x{rt:.3f} of none (median of {args.rounds} paired rounds)")
            out[name] = {"us_per_step": round(us, 1), "ratio_to_none": round(rt, 4)}
        own = {}  # variant -> {function: own seconds}
        for name, prof in profiles.items():
            own[name] = {f"{Path(fn).name}:{line}({func})": tt
                         for (fn, line, func), (_, _, tt, _, _) in pstats.Stats(prof).stats.items()}  # type: ignore[attr-defined]
        steps = args.rounds * args.block_steps
        for name in own:  # the profiler's own cost inflates these: compare variants, not clocks
            if name == "none":
                continue
            extra = sorted(((t - own["none"].get(f, 0.0), f) for f, t in own[name].items()), reverse=True)[:12]
            print(f"{name}: own time per step above none's (cProfile), largest first: "
                  + "; ".join(f"{f} +{d / steps * 1e6:.1f} us" for d, f in extra))
        print(json.dumps(out))
    finally:
        for c in consumers:
            c.close()
        for obs in observers.values():
            if obs is not None:
                obs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
