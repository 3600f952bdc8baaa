"""`infersight demo`."""
from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    console = Console(width=140)
    if args.engine == "vllm":
        from infersight.demo_vllm import VllmDemoConfig, run_vllm_demo
        from infersight.vllm.launch import VllmUnavailable

        try:
            run_vllm_demo(VllmDemoConfig(out_dir=Path(args.out), num_requests=args.requests,
                                         max_tokens=args.max_tokens, seed=args.seed,
                                         otlp_endpoint=args.otlp_endpoint), console)
        except VllmUnavailable as exc:
            console.print(f"error: {exc}", markup=False)
            return 2
        return 0
    from infersight.demo import DemoConfig, run_demo

    run_demo(DemoConfig(out_dir=Path(args.out), device=args.device, num_requests=args.requests,
                        max_tokens=args.max_tokens, seed=args.seed, recorder_budget=args.recorder_budget), console)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="engine + agent + a task-labelled workload; writes summary, Parquet, metrics")
    demo.add_argument("--out", default="infersight-out", help="output directory (default ./infersight-out)")
    demo.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda")
    demo.add_argument("--requests", type=int, default=96)
    demo.add_argument("--max-tokens", type=int, default=48)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--recorder-budget", type=float, metavar="RATIO",
                      help="the flight recorder's budget, a share of engine time (default: 0.1 on the CPU, where a "
                      "window costs seconds; the agent's 0.005 on CUDA)")
    demo.add_argument("--engine", choices=("reference", "vllm"), default="reference",
                      help="reference: infersight's runtime in-process; vllm: a real vLLM server (make vllm-env)")
    demo.add_argument("--otlp-endpoint", metavar="URL",
                      help="--engine vllm: export vLLM's spans, joined with infersight's data, to this collector")
    demo.set_defaults(func=run)
