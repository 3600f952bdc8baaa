"""`infersight demo`."""
from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from infersight.demo import DemoConfig, run_demo

    run_demo(DemoConfig(out_dir=Path(args.out), device=args.device, num_requests=args.requests,
                        max_tokens=args.max_tokens, seed=args.seed), Console(width=140))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="engine + agent + a task-labelled workload; writes summary, Parquet, metrics")
    demo.add_argument("--out", default="infersight-out", help="output directory (default ./infersight-out)")
    demo.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda")
    demo.add_argument("--requests", type=int, default=96)
    demo.add_argument("--max-tokens", type=int, default=48)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=run)
