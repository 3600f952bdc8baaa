"""Where a decode step's time goes on the GPU machine: host phases, the graph's device time in the
step and alone, and the kernels of one replay; plus the kernels of one long prefill.

    python3 benchmarks/decode_step_profile.py --batch 1 32 --prefill-len 8192 --out DIR

For each batch size and each decode forward (Transformer.forward, the fused forward), an engine
like `infersight bench runtime`'s (llama-1b-shape, bf16, prompt 512) runs warm decode steps with
the host phases timed by perf_counter wrappers (schedule, the runner's run, the input fill, the
graph launch, sampling with its device->host copy, the rest) and CUDA events around each replay.
Medians over the timed steps. Then torch.profiler over a few direct replays lists the kernels.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from infersight.runtime import Engine, EngineConfig, SamplingParams


class PhaseClock:
    """Wraps callables so that each call's host time adds to a per-step total, by phase name."""

    def __init__(self) -> None:
        self.step: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []

    def wrap(self, owner: object, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.step[phase] += time.perf_counter() - t0
        setattr(owner, name, timed)

    def close_step(self, wall: float) -> None:
        self.step["wall"] = wall
        self.steps.append(dict(self.step))
        self.step = defaultdict(float)

    def medians_us(self) -> dict[str, float]:
        keys = sorted({k for s in self.steps for k in s})
        return {k: round(1e6 * statistics.median(s.get(k, 0.0) for s in self.steps), 1) for k in keys}


def kernel_table(run, n: int = 5, top: int = 14) -> dict[str, object]:
    """torch.profiler over n calls of run(): kernels by total device time, per call."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            run()
        torch.cuda.synchronize()
    rows = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            key = ev.name[:90]
            rows[key][0] += 1
            rows[key][1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    if not rows:  # a profiler build that reports kernels only in its averages
        for avg in prof.key_averages():
            self_us = getattr(avg, "self_device_time_total", 0)
            if self_us > 0:
                rows[avg.key[:90]] = [avg.count, self_us]
    total_us = sum(t for _, t in rows.values()) / n
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]
    return {"kernels_per_call": round(sum(c for c, _ in rows.values()) / n, 1), "kernel_us_per_call": round(total_us, 1),
            "top": [(name, round(c / n, 1), round(t / n, 1)) for name, (c, t) in ranked]}


def decode_profile(batch: int, fused: bool, prompt_len: int, steps: int, compile_layers: bool) -> dict[str, object]:
    block = 16
    max_len = prompt_len + steps + 8
    per_seq = -(-max_len // block)
    config = EngineConfig(model="llama-1b-shape", device="cuda", dtype="bfloat16", enable_prefix_caching=False,
                          max_num_seqs=batch, max_num_batched_tokens=batch * prompt_len, block_size=block,
                          max_model_len=max_len, num_kv_blocks=batch * per_seq + 4, fused_forward=fused,
                          compile_layers=compile_layers)
    engine = Engine(config)
    gen = torch.Generator().manual_seed(0)
    for _ in range(batch):
        engine.add_request(torch.randint(0, 256, (prompt_len,), generator=gen).tolist(),
                           SamplingParams(temperature=0, max_tokens=steps + 4, ignore_eos=True))
    engine.step()
    for _ in range(3):
        engine.step()  # captures, compiles
    clock = PhaseClock()
    graphs = engine.target.graphs
    clock.wrap(engine.scheduler, "schedule", "schedule")
    clock.wrap(engine.target, "run", "runner.run")
    clock.wrap(engine, "_sample_plain", "sample+copy")
    if graphs is not None:
        clock.wrap(graphs.inputs, "fill", "inputs.fill")
    replay_ms: list[float] = []
    real_replay = torch.cuda.CUDAGraph.replay

    def replay(self):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        begin.record()
        real_replay(self)
        end.record()
        clock.step["graph launch"] += time.perf_counter() - t0
        replay_events.append((begin, end))
    replay_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    torch.cuda.CUDAGraph.replay = replay
    tokens = []
    try:
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            engine.step()
            torch.cuda.synchronize()
            clock.close_step(time.perf_counter() - t0)
        replay_ms = [b.elapsed_time(e) for b, e in replay_events]
    finally:
        torch.cuda.CUDAGraph.replay = real_replay
    tokens = [list(r.output_token_ids) for r in engine.requests.values()][:2]
    out: dict[str, object] = {"batch": batch, "fused": fused, "compile_layers": compile_layers,
                              "graphs": graphs is not None, "host_us": clock.medians_us(),
                              "replay_in_step_ms": round(statistics.median(replay_ms), 4) if replay_ms else None}
    if graphs is not None and graphs.graphs:
        from infersight.bench.engine.runtime import replay_alone_ms

        graph = list(graphs.graphs.values())[-1][0]
        out["replay_alone_ms"] = replay_alone_ms(graphs)
        launch, fill = [], []
        for _ in range(20):  # host cost of one launch, and of one input fill, with the GPU idle
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graph.replay()
            launch.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
        bucket, width = list(graphs.graphs)[-1]
        from infersight.runtime.runner.graph_inputs import decode_rows
        from infersight.runtime.runner.model_runner import FeedItem
        rows = decode_rows([FeedItem(r, r.num_computed, [0], 1) for r in engine.scheduler.running], graphs.block_size)
        for _ in range(20):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graphs.inputs.fill(rows, bucket, width)
            fill.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        out["launch_idle_us"] = round(1e6 * statistics.median(launch), 1)
        out["fill_idle_us"] = round(1e6 * statistics.median(fill), 1)
        out["kernels"] = kernel_table(graph.replay)
    out["first_tokens"] = [t[:8] for t in tokens]
    del engine, graphs
    torch.cuda.empty_cache()
    return out


def prefill_profile(tokens: int) -> dict[str, object]:
    import dataclasses

    from infersight.runtime.model.model_config import resolve_model

    cfg = resolve_model("llama-1b-shape")
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, tokens + 2))
    config = EngineConfig(model=cfg, device="cuda", dtype="bfloat16", enable_prefix_caching=False, max_num_seqs=1,
                          max_num_batched_tokens=tokens, max_model_len=tokens + 2,
                          num_kv_blocks=-(-(tokens + 2) // 16) + 4)
    engine = Engine(config)
    gen = torch.Generator().manual_seed(0)

    def one() -> None:
        engine.add_request(torch.randint(0, 256, (tokens,), generator=gen).tolist(),
                           SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    one()
    table = kernel_table(one, n=2, top=16)
    del engine
    torch.cuda.empty_cache()
    return {"prefill_tokens": tokens, "kernels": table}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--modes", nargs="+", default=["unfused", "fused"], help="unfused, fused, compiled (unfused + compile_layers)")
    ap.add_argument("--prefill-len", type=int, default=0)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    results = []
    for batch in args.batch:
        for mode in args.modes:
            r = decode_profile(batch, mode == "fused", args.prompt_len, args.steps, mode == "compiled")
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "kernels"}), flush=True)
            for name, count, us in r.get("kernels", {}).get("top", []):
                print(f"    {us:9.1f} us  x{count:5.1f}  {name}")
            print(f"    kernels per replay {r.get('kernels', {}).get('kernels_per_call')}, "
                  f"{r.get('kernels', {}).get('kernel_us_per_call')} us of kernels", flush=True)
    if args.prefill_len:
        r = prefill_profile(args.prefill_len)
        results.append(r)
        print(f"prefill {args.prefill_len}: {r['kernels']['kernels_per_call']} kernels, "
              f"{r['kernels']['kernel_us_per_call']} us of kernels")
        for name, count, us in r["kernels"]["top"]:
            print(f"    {us:9.1f} us  x{count:5.1f}  {name}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "decode_step_profile.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
