"""Where the demo's time to first token goes: the demo's engine and workload, without the agent.

Runs `infersight demo`'s engine config and workload (infersight.demo) once per variant, in order,
in one process, and prints per variant: TTFT p50 / p90 / max (from the engine's own request
timestamps: first token minus arrival), the first step's time, the step time by phase (median and
max), the slowest steps, and the queue at its longest. Variants:
  cold     the demo as it runs (a fresh process: Triton JIT, cuBLAS, graph captures on the way)
  again    a new engine in the same, now warm process, no warm-up requests
  warmed   a new engine with demo.warm_up() first (what the demo does now)
  nospec   like warmed, without the draft model (is speculation what slows the steps?)

    python benchmarks/demo_ttft.py --device cuda --variants cold,again,warmed,nospec
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch

from infersight.demo import DemoConfig, demo_engine_config, warm_up
from infersight.runtime import Engine, SamplingParams
from infersight.workload import WorkloadConfig, build_workload


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_variant(name: str, device: str, num_requests: int) -> dict:
    demo = DemoConfig(device=device, num_requests=num_requests)
    config = demo_engine_config(demo, device)
    if name == "nospec":
        config = dataclasses.replace(config, speculative_model=None)  # __post_init__ drops the draft
    t_build = time.monotonic()
    engine = Engine(config)
    build_s = time.monotonic() - t_build
    warm_s = 0.0
    if name in ("warmed", "nospec"):
        t0 = time.monotonic()
        warm_up(engine)
        warm_s = time.monotonic() - t0
    workload = build_workload(WorkloadConfig(num_requests=demo.num_requests, rate_per_s=demo.rate_per_s,
                                             max_tokens=demo.max_tokens, seed=demo.seed))
    pending, ids, steps = list(workload), [], []
    start = time.monotonic()
    while pending or engine.has_unfinished():
        now = time.monotonic() - start
        while pending and pending[0].arrival_s <= now:
            r = pending.pop(0)
            ids.append(engine.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.max_tokens,
                                                                   ignore_eos=True, task=r.task)))
        if engine.has_unfinished():
            s = engine.step()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            steps.append({"step": s.step_id, "phase": s.phase, "ms": (time.monotonic_ns() - s.start_ns) / 1e6,
                          "batch": len(s.batch), "waiting": s.num_waiting, "prefill": s.num_prefill_tokens,
                          "preempted": s.num_preempted, "at_s": round(time.monotonic() - start, 3)})
        elif pending:
            time.sleep(min(0.05, max(0.0, pending[0].arrival_s - now)))
    wall = time.monotonic() - start
    reqs = [engine.requests[i] for i in ids]
    ttft = [(r.times.first_token_ns - r.times.arrival_ns) / 1e9 for r in reqs if r.times.first_token_ns]
    by_phase: dict[str, dict[str, float]] = {}
    for phase in sorted({s["phase"] for s in steps}):
        ms = [s["ms"] for s in steps if s["phase"] == phase]
        by_phase[phase] = {"steps": len(ms), "median_ms": statistics.median(ms), "max_ms": max(ms),
                           "total_s": sum(ms) / 1e3}
    return {"variant": name, "device": device, "build_s": build_s, "warm_up_s": warm_s, "wall_s": wall,
            "requests": len(reqs), "ttft_p50_s": statistics.median(ttft), "ttft_p90_s": quantile(ttft, 0.9),
            "ttft_max_s": max(ttft), "first_step_ms": steps[0]["ms"] if steps else None,
            "cuda_graphs": engine.target.graphs is not None, "graph_blocker": engine.target.graph_blocker,
            "decode_attention": engine.decode_attention, "by_phase": by_phase,
            "slowest_steps": sorted(steps, key=lambda s: -s["ms"])[:8], "max_waiting": max(s["waiting"] for s in steps),
            "preemptions": sum(s["preempted"] for s in steps)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--variants", default="cold,again,warmed,nospec")
    p.add_argument("--num-requests", type=int, default=96)
    args = p.parse_args(argv)
    results = []
    for name in args.variants.split(","):
        if name not in ("cold", "again", "warmed", "nospec"):
            p.error(f"unknown variant {name!r}")
        r = run_variant(name, args.device, args.num_requests)
        results.append(r)
        phases = ", ".join(f"{k} {v['steps']}x med {v['median_ms']:.1f} max {v['max_ms']:.0f} ms"
                           for k, v in r["by_phase"].items())
        print(f"{name}: TTFT p50 {r['ttft_p50_s'] * 1e3:.0f} ms p90 {r['ttft_p90_s'] * 1e3:.0f} max "
              f"{r['ttft_max_s'] * 1e3:.0f} ms; wall {r['wall_s']:.1f} s; build {r['build_s']:.1f} s, warm-up "
              f"{r['warm_up_s']:.1f} s; first step {r['first_step_ms']:.0f} ms; graphs {r['cuda_graphs']} "
              f"({r['graph_blocker']}); max waiting {r['max_waiting']}; preemptions {r['preemptions']}; {phases}",
              file=sys.stderr)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
