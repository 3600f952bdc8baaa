"""`infersight agent`."""
from __future__ import annotations

import argparse


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def run(args: argparse.Namespace) -> int:
    import logging
    import signal

    from infersight.agent.config import AgentConfig
    from infersight.agent.service import Agent

    logging.basicConfig(level=logging.INFO, format="%(asctime)s infersight-agent %(levelname)s %(message)s")
    host, port = parse_listen(args.listen)
    agent = Agent(AgentConfig(rings=args.ring or [], discover=args.discover, host=host, port=port,
                              poll_interval_s=args.poll_interval, parquet_dir=args.parquet_dir,
                              vllm_compat=args.vllm_compat, model_name=args.model_name,
                              max_expert_series=args.max_expert_series))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: agent.stop())
    agent.run(args.duration)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
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
    agent.set_defaults(func=run)
