"""`infersight agent`'s tracing flags (--otlp-* and --trace-*), and the TracingConfig they give."""
from __future__ import annotations

import argparse

from infersight.tracing.config import TracingConfig  # light: no OpenTelemetry


def add_tracing_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags, in their own group."""
    tracing = parser.add_argument_group("tracing (OTLP; off unless --otlp-endpoint is given)")
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
    tracing.add_argument("--otlp-receiver", nargs="?", const="127.0.0.1:4318", metavar="HOST:PORT",
                         help="receive an engine's spans over OTLP/HTTP (vLLM: --otlp-traces-endpoint "
                              "http://HOST:PORT/v1/traces) and join them with its requests (default 127.0.0.1:4318)")
    tracing.add_argument("--otlp-receiver-grpc", nargs="?", const="127.0.0.1:4317", metavar="HOST:PORT",
                         help="the same over OTLP/gRPC (vLLM's default protocol; default 127.0.0.1:4317)")
    tracing.add_argument("--otlp-join-wait", type=float, default=10.0, metavar="SECONDS",
                         help="how long a request's span and row wait for each other (default 10)")
    tracing.add_argument("--otlp-queue-spans", type=int, metavar="N",
                         help="spans the export queue holds (default OTEL_BSP_MAX_QUEUE_SIZE, else 2048)")
    tracing.add_argument("--otlp-queue-bytes", type=int, default=16 << 20, metavar="BYTES",
                         help="bytes the export queue holds (estimated; default 16 MiB); beyond: dropped, counted")
    tracing.add_argument("--otlp-export-timeout", type=float, metavar="SECONDS",
                         help="one OTLP export, retries included (default OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, else 2)")
    tracing.add_argument("--otlp-shutdown-timeout", type=float, default=3.0, metavar="SECONDS",
                         help="the last flush at exit (<= 5; default 3): what is still unsent is counted and logged")
    tracing.add_argument("--trace-buffer-bytes", type=int, default=64 << 20, metavar="BYTES",
                         help="what the tracing hook and the span join keep between batches (default 64 MiB)")


def tracing_config(args: argparse.Namespace) -> TracingConfig:
    """ValueError (exit 2) on a bad value."""
    return TracingConfig(otlp_endpoint=args.otlp_endpoint, otlp_protocol=args.otlp_protocol,
                         trace_sample_ratio=args.trace_sample_ratio, export_content=args.export_content,
                         otlp_metrics=args.otlp_metrics, otlp_receiver=args.otlp_receiver,
                         otlp_receiver_grpc=args.otlp_receiver_grpc, otlp_join_wait_s=args.otlp_join_wait,
                         otlp_queue_spans=args.otlp_queue_spans, otlp_queue_bytes=args.otlp_queue_bytes,
                         otlp_export_timeout_s=args.otlp_export_timeout,
                         otlp_shutdown_timeout_s=args.otlp_shutdown_timeout,
                         trace_buffer_bytes=args.trace_buffer_bytes)
