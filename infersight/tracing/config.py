"""The tracing part's one config object: OTLP export, the receiver of an engine's own spans, and the
bounds on both, validated when built. AgentConfig holds one (AgentConfig.tracing), filled from the
agent's tracing flags (commands/agent_tracing.py); tracing reads only this, never the agent's config.
"""
from __future__ import annotations

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
        if not 0 < self.otlp_shutdown_timeout_s <= 5:
            raise ValueError(f"the OTLP shutdown timeout must be in (0, 5] s, got {self.otlp_shutdown_timeout_s}")

    @property
    def receiver_on(self) -> bool:
        return bool(self.otlp_receiver or self.otlp_receiver_grpc)
