"""The `infersight` command line: parse arguments, call a library function, print."""
from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console


def _cmd_demo(args: argparse.Namespace) -> int:
    from infersight.demo import DemoConfig, print_demo, run_demo

    results = run_demo(DemoConfig(device=args.device, max_tokens=args.max_tokens, seed=args.seed,
                                  draft=None if args.no_speculation else "tiny-draft"))
    print_demo(results, Console(width=140))
    return 0


def _cmd_bench_runtime(args: argparse.Namespace) -> int:
    from infersight.bench.runtime import as_dict, bench_runtime

    result = as_dict(bench_runtime(model=args.model, device=args.device, dtype=args.dtype, batch=args.batch,
                                   prompt_len=args.prompt_len, decode_steps=args.decode_steps))
    if not args.json:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    print(json.dumps(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infersight", description="Observability for LLM inference engines.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the reference engine on a small workload and explain each request")
    demo.add_argument("--device", default="cpu")
    demo.add_argument("--max-tokens", type=int, default=48)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--no-speculation", action="store_true")
    demo.set_defaults(func=_cmd_demo)

    bench = sub.add_parser("bench", help="measure the runtime or the probes")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    rt = bench_sub.add_parser("runtime", help="prefill and decode tokens/s")
    rt.add_argument("--model", default="tiny-moe")
    rt.add_argument("--device", default="cpu")
    rt.add_argument("--dtype", default="float32")
    rt.add_argument("--batch", type=int, default=16)
    rt.add_argument("--prompt-len", type=int, default=128)
    rt.add_argument("--decode-steps", type=int, default=32)
    rt.add_argument("--json", action="store_true", help="print only the JSON result")
    rt.set_defaults(func=_cmd_bench_runtime)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as exc:  # bad input: a message, not a traceback
        print(f"infersight: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
