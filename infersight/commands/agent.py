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
                              max_expert_series=args.max_expert_series, otlp_endpoint=args.otlp_endpoint,
                              otlp_protocol=args.otlp_protocol, trace_sample_ratio=args.trace_sample_ratio,
                              export_content=args.export_content, otlp_metrics=args.otlp_metrics))
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
    tracing = agent.add_argument_group("tracing (OTLP; off unless --otlp-endpoint is given)")
    tracing.add_argument("--otlp-endpoint", nargs="?", const="", metavar="URL",
                         help="export request spans to this OTLP collector (http/protobuf: http://HOST:4318); "
                              "without URL: from the OTEL_EXPORTER_OTLP_* variables")
    tracing.add_argument("--otlp-protocol", choices=("http/protobuf", "grpc"),
                         help="default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf")
    tracing.add_argument("--trace-sample-ratio", type=float, default=1.0,
                         help="share of requests traced (slow and failed ones always are; default 1.0)")
    tracing.add_argument("--export-content", action="store_true",
                         help="put prompt and completion text on spans (the server must send it: serve --export-content)")
    tracing.add_argument("--otlp-metrics", action="store_true",
                         help="also export gen_ai.server.* histograms over OTLP")
    agent.set_defaults(func=run)
