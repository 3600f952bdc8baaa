"""The `infersight` command line: parse arguments, call a library function, print."""
from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console


def _cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from infersight.demo import DemoConfig, run_demo

    run_demo(DemoConfig(out_dir=Path(args.out), device=args.device, num_requests=args.requests,
                        max_tokens=args.max_tokens, seed=args.seed), Console(width=140))
    return 0


def _cmd_bench_runtime(args: argparse.Namespace) -> int:
    from infersight.bench.runtime import as_dict, bench_runtime

    result = as_dict(bench_runtime(model=args.model, device=args.device, dtype=args.dtype, batch=args.batch,
                                   prompt_len=args.prompt_len, decode_steps=args.decode_steps))
    return _print_result(result, args.json)


def _cmd_bench_overhead(args: argparse.Namespace) -> int:
    from infersight.bench.overhead import as_dict, bench_overhead

    result = as_dict(bench_overhead(model=args.model, device=args.device, dtype=args.dtype, batch=args.batch,
                                    steps=args.steps))
    return _print_result(result, args.json)


def _cmd_bench_ingest(args: argparse.Namespace) -> int:
    from infersight.probes.ring import bench_ingest

    return _print_result(dict(bench_ingest(args.records, args.capacity)), args.json)


def _cmd_agent(args: argparse.Namespace) -> int:
    import logging
    import signal

    from infersight.agent.config import AgentConfig
    from infersight.agent.service import Agent

    logging.basicConfig(level=logging.INFO, format="%(asctime)s infersight-agent %(levelname)s %(message)s")
    host, port = _parse_listen(args.listen)
    agent = Agent(AgentConfig(rings=args.ring or [], discover=args.discover, host=host, port=port,
                              poll_interval_s=args.poll_interval, parquet_dir=args.parquet_dir,
                              vllm_compat=args.vllm_compat, model_name=args.model_name,
                              max_expert_series=args.max_expert_series))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: agent.stop())
    agent.run(args.duration)
    return 0


def _parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _cmd_bench_agent(args: argparse.Namespace) -> int:
    from infersight.bench.agent import as_dict, bench_agent

    return _print_result(as_dict(bench_agent(args.requests, args.tokens)), args.json)


def _print_result(result: dict[str, object], json_only: bool) -> int:
    """Key: value lines for people, then one JSON object last for programs."""
    if not json_only:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    print(json.dumps(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infersight", description="Observability for LLM inference engines.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="engine + agent + a task-labelled workload; writes summary, Parquet, metrics")
    demo.add_argument("--out", default="infersight-out", help="output directory (default ./infersight-out)")
    demo.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda")
    demo.add_argument("--requests", type=int, default=96)
    demo.add_argument("--max-tokens", type=int, default=48)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_cmd_demo)

    agent = sub.add_parser("agent", help="the sidecar: attach to probe rings, serve /metrics and the JSON API")
    agent.add_argument("--ring", action="append", help="ring name to attach (repeatable)")
    agent.add_argument("--discover", action="store_true", help="also attach every infersight-* ring that appears")
    agent.add_argument("--listen", default="127.0.0.1:9464", help="HOST:PORT (default 127.0.0.1:9464)")
    agent.add_argument("--poll-interval", type=float, default=0.1, help="seconds between ring reads")
    agent.add_argument("--parquet-dir", help="write per-request rows to DIR/requests.parquet")
    agent.add_argument("--vllm-compat", action="store_true", help="also serve vLLM metric names")
    agent.add_argument("--model-name", default="tiny-moe", help="model_name label of the vLLM-compatible view")
    agent.add_argument("--max-expert-series", type=int, default=512, help="cap on layers x experts series")
    agent.add_argument("--duration", type=float, help="stop after this many seconds")
    agent.set_defaults(func=_cmd_agent)

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
    ov = bench_sub.add_parser("overhead", help="probes off / NVTX only / all probes, interleaved decode steps")
    ov.add_argument("--model", default="tiny-moe")
    ov.add_argument("--device", default="cpu")
    ov.add_argument("--dtype", default="float32")
    ov.add_argument("--batch", type=int, default=16)
    ov.add_argument("--steps", type=int, default=200)
    ov.add_argument("--json", action="store_true", help="print only the JSON result")
    ov.set_defaults(func=_cmd_bench_overhead)
    ing = bench_sub.add_parser("ingest", help="producer -> ring -> consumer events/s with drop accounting")
    ing.add_argument("--records", type=int, default=1_000_000)
    ing.add_argument("--capacity", type=int, default=1 << 16)
    ing.add_argument("--json", action="store_true", help="print only the JSON result")
    ing.set_defaults(func=_cmd_bench_ingest)
    ag = bench_sub.add_parser("agent", help="agent ingest events/s, event-to-/metrics latency, peak RSS")
    ag.add_argument("--requests", type=int, default=2048)
    ag.add_argument("--tokens", type=int, default=32, help="decode steps per request")
    ag.add_argument("--json", action="store_true", help="print only the JSON result")
    ag.set_defaults(func=_cmd_bench_agent)
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
