"""The tracing part's one config object: OTLP export, the receiver of an engine's own spans, and the
bounds on both, validated when built. AgentConfig holds one (AgentConfig.tracing), filled from the
agent's tracing flags (add_flags / from_args); tracing reads only this, never the agent's config.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class TracingConfig:
    """otlp_endpoint None: tracing off; "": on, the endpoint from the OTEL_EXPORTER_OTLP_* variables;
    else the collector's base URL. otlp_receiver / otlp_receiver_grpc: "HOST:PORT" of the listeners for
    an engine's own spans (None: off), each joined with its row, waiting at most otlp_join_wait_s.
    The queue and buffer bounds: what does not fit is dropped and counted (tracing.export_queue)."""

    otlp_endpoint: str | None = None
    otlp_protocol: str | None = None  # http/protobuf (default) | grpc; None: OTEL_EXPORTER_OTLP_PROTOCOL
    trace_sample_ratio: float = 1.0   # head ratio; slow and failed requests are always kept
    export_content: bool = False      # prompt/completion text on spans (when the server sent it too)
    otlp_metrics: bool = False        # gen_ai.server.* histograms over OTLP as well
    otlp_receiver: str | None = None
    otlp_receiver_grpc: str | None = None
    otlp_join_wait_s: float = 10.0
    otlp_queue_spans: int | None = None  # None: OTEL_BSP_MAX_QUEUE_SIZE, else 2048
    otlp_queue_bytes: int = 16 << 20
    otlp_export_timeout_s: float | None = None  # one export; None: OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, else 2 s
    otlp_shutdown_timeout_s: float = 3.0  # the whole flush at shutdown
    trace_buffer_bytes: int = 64 << 20  # the hook's and the span join's buffers together (estimated bytes)
    # Steps a request span links at most: its prefill steps, then its slowest (tracing.spans.step_links). Each
    # link is also a step span to send; every step of every request cost the agent most of a core at ~115
    # requests/s of 96 tokens (BENCHMARKS.md, "The agent's OTLP export").
    step_links: int = 8

    def __post_init__(self) -> None:
        """ValueError for a setting tracing cannot run with (the agent's CLI shows it as one line)."""
        if not 0.0 <= self.trace_sample_ratio <= 1.0:
            raise ValueError(f"trace sample ratio must be in [0, 1], got {self.trace_sample_ratio}")
        if self.otlp_protocol not in (None, "http/protobuf", "grpc"):
            raise ValueError(f"OTLP protocol must be http/protobuf or grpc, got {self.otlp_protocol!r}")
        if self.receiver_on and self.otlp_endpoint is None:
            raise ValueError("the OTLP receiver needs --otlp-endpoint: the joined spans are exported there")
        if not 0.0 <= self.otlp_join_wait_s <= 600.0:
            raise ValueError(f"the OTLP join wait must be in [0, 600] s, got {self.otlp_join_wait_s}")
        if self.otlp_queue_spans is not None and self.otlp_queue_spans < 1:
            raise ValueError(f"the OTLP queue must hold >= 1 span, got {self.otlp_queue_spans}")
        if self.otlp_queue_bytes < 1 << 16 or self.trace_buffer_bytes < 1 << 16:
            raise ValueError("the OTLP queue and trace buffer byte limits must be >= 65536")
        if self.otlp_export_timeout_s is not None and not 0 < self.otlp_export_timeout_s <= 60:
            raise ValueError(f"the OTLP export timeout must be in (0, 60] s, got {self.otlp_export_timeout_s}")
        if not 0 <= self.step_links <= 128:
            raise ValueError(f"--trace-step-links must be in [0, 128] (the SDK's link limit), got {self.step_links}")
        if not 0 < self.otlp_shutdown_timeout_s <= 5:
            raise ValueError(f"the OTLP shutdown timeout must be in (0, 5] s, got {self.otlp_shutdown_timeout_s}")

    @property
    def receiver_on(self) -> bool:
        return bool(self.otlp_receiver or self.otlp_receiver_grpc)

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        """The agent's --otlp-* and --trace-* flags, in their own group."""
        tracing = parser.add_argument_group("tracing (OTLP; off unless --otlp-endpoint is given)")
        tracing.add_argument("--otlp-endpoint", nargs="?", const="", metavar="URL",
                             help="export request spans to this OTLP collector (http/protobuf: http://HOST:4318); "
                                  "without URL: from the OTEL_EXPORTER_OTLP_* variables")
        tracing.add_argument("--otlp-protocol", choices=("http/protobuf", "grpc"),
                             help="default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf")
        tracing.add_argument("--trace-sample-ratio", type=float, default=1.0,
                             help="share of requests traced (slow and failed ones always are; default 1.0)")
        tracing.add_argument("--export-content", action="store_true",
                             help="put prompt and completion text on spans (the server must send it: "
                                  "serve --export-content)")
        tracing.add_argument("--otlp-metrics", action="store_true",
                             help="also export gen_ai.server.* histograms over OTLP")
        tracing.add_argument("--otlp-receiver", nargs="?", const="127.0.0.1:4318", metavar="HOST:PORT",
                             help="receive an engine's spans over OTLP/HTTP (vLLM: --otlp-traces-endpoint "
                                  "http://HOST:PORT/v1/traces) and join them with its requests "
                                  "(default 127.0.0.1:4318)")
        tracing.add_argument("--otlp-receiver-grpc", nargs="?", const="127.0.0.1:4317", metavar="HOST:PORT",
                             help="the same over OTLP/gRPC (vLLM's default protocol; default 127.0.0.1:4317)")
        tracing.add_argument("--otlp-join-wait", type=float, default=10.0, metavar="SECONDS",
                             help="how long a request's span and row wait for each other (default 10)")
        tracing.add_argument("--otlp-queue-spans", type=int, metavar="N",
                             help="spans the export queue holds (default OTEL_BSP_MAX_QUEUE_SIZE, else 2048)")
        tracing.add_argument("--otlp-queue-bytes", type=int, default=16 << 20, metavar="BYTES",
                             help="bytes the export queue holds (estimated; default 16 MiB); beyond: dropped, "
                                  "counted")
        tracing.add_argument("--otlp-export-timeout", type=float, metavar="SECONDS",
                             help="one OTLP export, retries included (default "
                                  "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, else 2)")
        tracing.add_argument("--otlp-shutdown-timeout", type=float, default=3.0, metavar="SECONDS",
                             help="the last flush at exit (<= 5; default 3): what is still unsent is counted "
                                  "and logged")
        tracing.add_argument("--trace-buffer-bytes", type=int, default=64 << 20, metavar="BYTES",
                             help="what the tracing hook and the span join keep between batches (default 64 MiB)")
        tracing.add_argument("--trace-step-links", type=int, default=8, metavar="N",
                             help="engine steps each request span links at most: its prefill steps, then its "
                                  "slowest (0-128; default 8); each linked step is also exported as a span")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TracingConfig:
        """ValueError (exit 2) on a bad value."""
        return cls(otlp_endpoint=args.otlp_endpoint, otlp_protocol=args.otlp_protocol,
                   trace_sample_ratio=args.trace_sample_ratio, export_content=args.export_content,
                   otlp_metrics=args.otlp_metrics, otlp_receiver=args.otlp_receiver,
                   otlp_receiver_grpc=args.otlp_receiver_grpc, otlp_join_wait_s=args.otlp_join_wait,
                   otlp_queue_spans=args.otlp_queue_spans, otlp_queue_bytes=args.otlp_queue_bytes,
                   otlp_export_timeout_s=args.otlp_export_timeout,
                   otlp_shutdown_timeout_s=args.otlp_shutdown_timeout,
                   trace_buffer_bytes=args.trace_buffer_bytes, step_links=args.trace_step_links)
