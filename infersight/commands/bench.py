"""`infersight bench runtime|overhead|ingest|agent|speculation|serving|ceilings`."""
from __future__ import annotations

import argparse

from infersight.commands.output import print_result

#: The arms of `bench serving` (infersight.bench.serving.config.ARMS; not imported here: the CLI loads lazily).
SERVING_ARMS = ("none", "none_again", "agent", "agent_recorder", "full")


def _runtime(args: argparse.Namespace) -> int:
    from infersight.bench.engine.runtime import as_dict, bench_runtime

    return print_result(as_dict(bench_runtime(model=args.model, device=args.device, dtype=args.dtype,
                                              batch=args.batch, prompt_len=args.prompt_len,
                                              decode_steps=args.decode_steps,
                                              decode_attention=args.decode_attention,
                                              enforce_eager=args.enforce_eager, compare_eager=args.compare_eager,
                                              hf_anchor=args.hf_anchor, compile_layers=args.compile_layers,
                                              fused_forward=not args.unfused,
                                              prefill_len=args.prefill_len,
                                              async_scheduling=args.async_scheduling,
                                              decode_gemv=not args.no_gemv, temperature=args.temperature)), args.json)


def _overhead(args: argparse.Namespace) -> int:
    from infersight.bench.engine.overhead import as_dict, bench_overhead

    return print_result(as_dict(bench_overhead(model=args.model, device=args.device, dtype=args.dtype,
                                               batch=args.batch, steps=args.steps)), args.json)


def _ingest(args: argparse.Namespace) -> int:
    from infersight.probes.ring import bench_ingest

    return print_result(dict(bench_ingest(args.records, args.capacity)), args.json)


def _agent(args: argparse.Namespace) -> int:
    from infersight.bench.agent import as_dict, bench_agent

    return print_result(as_dict(bench_agent(args.requests, args.tokens)), args.json)


def _speculation(args: argparse.Namespace) -> int:
    from infersight.bench.speculation.fixed_batch_ab import bench_speculation

    if args.demo_workload:
        return _speculation_demo_workload(args)
    return print_result(bench_speculation(model=args.model, draft=args.draft, gamma=args.gamma, requests=args.requests,
                                          batch=args.batch, rounds=args.rounds, probe_every=args.probe_every,
                                          max_tokens=args.max_tokens, device=args.device,
                                          threads=args.threads, gammas=tuple(args.try_gamma), seed=args.seed,
                                          dtype=args.dtype, frames_out=args.frames_out,
                                          num_kv_blocks=args.num_kv_blocks,
                                          cpu_offload_blocks=args.cpu_offload_blocks), args.json)


def _speculation_demo_workload(args: argparse.Namespace) -> int:
    """The demo's engine and workload (its defaults; --seed, --rounds, --device, --threads honoured)."""
    import torch

    from infersight.bench.speculation.arrivals_ab import bench_speculation_on_arrivals
    from infersight.demo import DemoConfig, demo_engine_config
    from infersight.workload import WorkloadConfig, build_workload

    demo = DemoConfig(seed=args.seed, device=args.device)
    workload = build_workload(WorkloadConfig(num_requests=demo.num_requests, rate_per_s=demo.rate_per_s,
                                             max_tokens=demo.max_tokens, seed=demo.seed))
    old = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        result = bench_speculation_on_arrivals(demo_engine_config(demo, args.device), workload, rounds=args.rounds,
                                               frames_out=args.frames_out, observed_arms=args.observed_arms)
    finally:
        torch.set_num_threads(old)
    return print_result(result, args.json)


def _serving(args: argparse.Namespace) -> int:
    import json
    import sys

    from infersight.bench.serving.run import bench_serving
    from infersight.bench.serving.config import ServingBenchConfig
    from infersight.bench.serving.processes import ProcessFailed
    from infersight.bench.serving.report import print_report
    from infersight.bench.serving.switchback_run import bench_serving_switchback, print_switchback_report

    config = ServingBenchConfig(model=args.model, device=args.device, dtype=args.dtype, clients=args.clients,
                                max_tokens=args.max_tokens, max_tokens_spread=args.max_tokens_spread,
                                phase_s=args.phase_s, warmup_s=args.warmup_s,
                                rounds=args.rounds, arms=tuple(a for a in args.arms.split(",") if a), seed=args.seed,
                                serve_args=tuple(args.serve_arg), agent_args=tuple(args.agent_arg),
                                switchback_block_s=args.switchback_block_s, switchback_pairs=args.switchback_pairs,
                                calibration_pause=args.calibration_pause)
    switchback = config.switchback_block_s > 0
    try:
        report = (bench_serving_switchback if switchback else bench_serving)(
            config, log=lambda line: print(line, file=sys.stderr, flush=True))
    except ProcessFailed as exc:
        print(f"infersight bench serving: {exc}", file=sys.stderr)
        return 1
    report.pop("frames")
    if not args.json:
        (print_switchback_report if switchback else print_report)(report)
    print(json.dumps(report, default=float))
    return 0


def _ceilings(args: argparse.Namespace) -> int:
    from pathlib import Path

    from infersight.bench.ceilings import as_dict, bench_ceilings

    return print_result(as_dict(bench_ceilings(device=args.device, dtype=args.dtype, copy_mib=args.copy_mib,
                                               gemm_n=args.gemm_n, warmup=args.warmup, repeats=args.repeats,
                                               cache=Path(args.cache) if args.cache else None,
                                               write=not args.no_cache)), args.json)


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="measure the runtime, the probes or the agent")
    bench_sub = bench.add_subparsers(dest="bench", required=True)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", default="tiny-moe")
        p.add_argument("--device", default="cpu")
        p.add_argument("--dtype", default="float32")
        p.add_argument("--batch", type=int, default=16)

    rt = bench_sub.add_parser("runtime", help="prefill and decode tokens/s")
    model_args(rt)
    rt.add_argument("--prompt-len", type=int, default=128)
    rt.add_argument("--decode-steps", type=int, default=32)
    rt.add_argument("--decode-attention", choices=("auto", "torch", "triton"), default="auto",
                    help="paged decode kernel (auto: triton on CUDA when installed)")
    rt.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode steps")
    rt.add_argument("--compare-eager", action="store_true",
                    help="with CUDA graphs: a block of graph decode steps, then a block of eager ones; report both")
    rt.add_argument("--compile-layers", action="store_true",
                    help="torch.compile the layers' norms, RoPE and SwiGLU (CUDA; EngineConfig.compile_layers; "
                         "with --unfused: the fused forward does not call those modules)")
    rt.add_argument("--unfused", action="store_true",
                    help="forwards through Transformer.forward, not the fused kernels (EngineConfig.fused_forward)")
    rt.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                    help="launch each steady decode step before reading the one before (vLLM's flag; "
                         "EngineConfig.async_scheduling; default: on for CUDA); steps are then timed back to back")
    rt.add_argument("--temperature", type=float, default=0.0,
                    help="the decode requests' temperature (0: greedy; above: sampled, a seed per request)")
    rt.add_argument("--no-gemv", action="store_true",
                    help="batch-1 projections through cuBLAS, not runtime.model.triton_gemv (EngineConfig.decode_gemv)")
    rt.add_argument("--prefill-len", type=int, default=0,
                    help="also prefill one prompt of this many tokens in one step; modelled TFLOP/s against the GEMM ceiling")
    rt.add_argument("--hf-anchor", choices=("none", "eager", "all"), default="none",
                    help="also time Hugging Face transformers on the same shape (all: eager and static cache + compile)")
    rt.set_defaults(func=_runtime)
    ov = bench_sub.add_parser("overhead", help="probes off / NVTX only / all probes, interleaved decode steps")
    model_args(ov)
    ov.add_argument("--steps", type=int, default=200)
    ov.set_defaults(func=_overhead)
    ing = bench_sub.add_parser("ingest", help="producer -> ring -> consumer records/s (one record a slot), "
                              "with drop accounting")
    ing.add_argument("--records", type=int, default=1_000_000)
    ing.add_argument("--capacity", type=int, default=1 << 16)
    ing.set_defaults(func=_ingest)
    ag = bench_sub.add_parser("agent", help="agent ingest records/s and ring slots/s (one poll, wall and CPU time), "
                             "event-to-/metrics latency, peak RSS")
    ag.add_argument("--requests", type=int, default=2048)
    ag.add_argument("--tokens", type=int, default=32, help="decode steps per request")
    ag.set_defaults(func=_agent)
    sp = bench_sub.add_parser("speculation", help="measured vs predicted speedup of speculation, per task")
    sp.add_argument("--model", default="tiny-moe")
    sp.add_argument("--draft", default="tiny-draft", help="the speculative (draft) model")
    sp.add_argument("--gamma", type=int, default=4, help="draft tokens per step")
    sp.add_argument("--requests", type=int, default=32, help="workload requests (all tasks)")
    sp.add_argument("--batch", type=int, default=4, help="requests in flight, kept full")
    sp.add_argument("--rounds", type=int, default=3, help="repeats, for the noise")
    sp.add_argument("--probe-every", type=int, default=4, help="the predicting engine's spec_probe_every")
    sp.add_argument("--max-tokens", type=int, default=48)
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"),
                    help="auto: bfloat16 on CUDA, float32 on the CPU")
    sp.add_argument("--seed", type=int, default=0, help="the workload's seed")
    sp.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")
    sp.add_argument("--try-gamma", type=int, action="append", default=[], metavar="G",
                    help="also measure this draft length (repeatable), to see whether another gamma is faster")
    sp.add_argument("--num-kv-blocks", type=int, metavar="N",
                    help="every engine's device KV blocks (default: ample, (batch + 1) x 32: no preemption); "
                         "the demo's 160 times an engine under the demo's KV pressure")
    sp.add_argument("--cpu-offload-blocks", type=int, default=0, metavar="N",
                    help="every engine's CPU swap tier (default 0; the demo's: 64)")
    sp.add_argument("--demo-workload", action="store_true",
                    help="the demo's engine and workload instead (every task mixed, its arrivals, its KV pool and "
                         "probe rate): its predictions against an A/B of that load (--model, --draft, --batch, "
                         "--requests, --probe-every, the pool flags are then the demo's)")
    sp.add_argument("--frames-out", default=None, metavar="DIR",
                    help="write the predicting engine's spec and step_timing frames here (parquet), for offline study, "
                         "and every arm's steps (steps.parquet: arm, kind, batch, times; by task at a fixed batch)")
    sp.add_argument("--observed-arms", action="store_true",
                    help="with --demo-workload: also the plain and speculative engines each with a probe observer "
                         "attached, as the predicting engine has (measured_speedup_observed)")
    sp.set_defaults(func=_speculation)
    sv = bench_sub.add_parser("serving", help="what observing costs the client: closed-loop HTTP clients against "
                              "`serve`, arms with and without the agent interleaved, ratios with an A/A floor")
    sv.add_argument("--model", default="tiny-moe")
    sv.add_argument("--device", default="cpu", help="cpu or cuda")
    sv.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"),
                    help="auto: bfloat16 on CUDA, float32 on the CPU")
    sv.add_argument("--clients", type=int, default=8, help="closed-loop clients (each sends when its last ends)")
    sv.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    sv.add_argument("--max-tokens-spread", type=float, default=0.0, metavar="F",
                    help="each request's output tokens drawn from --max-tokens x [1 - F, 1 + F] (0: all equal; "
                         "equal lengths keep closed-loop clients in lockstep waves)")
    sv.add_argument("--phase-s", type=float, default=20.0, help="seconds of each arm's phase")
    sv.add_argument("--warmup-s", type=float, default=3.0, help="first seconds of a phase left out")
    sv.add_argument("--rounds", type=int, default=5, help="rounds; each runs every arm once, order rotated")
    sv.add_argument("--arms", default=",".join(SERVING_ARMS),
                    help=f"comma-separated, some of {','.join(SERVING_ARMS)} (none is required)")
    sv.add_argument("--seed", type=int, default=0)
    sv.add_argument("--serve-arg", action="append", default=[], metavar="FLAG",
                    help="one more `infersight serve` flag for every arm, e.g. --serve-arg=--scheduler-delay-factor=2 "
                         "(repeatable)")
    sv.add_argument("--agent-arg", action="append", default=[], metavar="FLAG",
                    help="one more `infersight agent` flag for every agent arm, e.g. --agent-arg=--recorder-initial-cost=0.05 "
                         "where windows are known to be cheap (repeatable)")
    sv.add_argument("--switchback-block-s", type=float, default=0.0, metavar="S",
                    help="switchback instead of phases: per arm one phase of --switchback-pairs pairs of S-second "
                         "blocks, the arm's agent stopped (SIGSTOP) in one block of each pair; cancels drift slower "
                         "than a pair (0: phases per arm, the default)")
    sv.add_argument("--switchback-pairs", type=int, default=30, help="block pairs per switchback phase")
    sv.add_argument("--calibration-pause", type=float, default=0.0, metavar="SHARE",
                    help="with --switchback-block-s: add the arm engine_paused, serve's engine stopped for SHARE of "
                         "every 0.5 s in its on blocks, a known loss the method must read back (e.g. 0.02)")
    sv.set_defaults(func=_serving)
    ce = bench_sub.add_parser("ceilings", help="measure this device's copy bandwidth and GEMM throughput, and cache "
                              "them as the roofline's ceilings")
    ce.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    ce.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                    help="the tensors' dtype (default: bfloat16 on CUDA, float32 on the CPU)")
    ce.add_argument("--copy-mib", type=int, help="MiB copied per timed copy (default: 2048 on CUDA, 256 on the CPU)")
    ce.add_argument("--gemm-n", type=int, help="the matmul is n x n x n (default: 8192 on CUDA, 2048 on the CPU)")
    ce.add_argument("--warmup", type=int, help="untimed runs of each first (default: 5 on CUDA, 1 on the CPU)")
    ce.add_argument("--repeats", type=int, help="timed runs of each; the median is kept (default: 20 on CUDA, "
                    "5 on the CPU)")
    ce.add_argument("--cache", help="the ceilings cache to write (default: $INFERSIGHT_CEILINGS, else "
                    "$XDG_CACHE_HOME/infersight/ceilings.json)")
    ce.add_argument("--no-cache", action="store_true", help="measure and print only; do not write the cache")
    ce.set_defaults(func=_ceilings)
    for p in (rt, ov, ing, ag, sp, sv, ce):
        p.add_argument("--json", action="store_true", help="print only the JSON result")
