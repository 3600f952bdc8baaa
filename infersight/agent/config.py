"""The agent's one config object, validated when built (ConfigError -> exit code 2 in the CLI)."""
from __future__ import annotations

from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A setting the agent cannot run with."""


@dataclass
class AgentConfig:
    """rings: ring names to attach; discover: also attach every infersight-* ring that appears.
    max_expert_series: per-(layer, expert) series only while layers x experts <= this; beyond it
    the exposition sums over layers and adds the top_hot_pairs hottest pairs."""

    rings: list[str] = field(default_factory=list)
    discover: bool = False
    host: str = "127.0.0.1"
    port: int = 9464
    poll_interval_s: float = 0.1
    parquet_dir: str | None = None
    max_expert_series: int = 512
    top_hot_pairs: int = 10
    slow_window: int = 1000
    min_requests_for_p99: int = 20
    retain_requests: int = 10_000
    vllm_compat: bool = False
    model_name: str = "tiny-moe"
    retry_interval_s: float = 2.0
    # -- tracing (opt-in; infersight.tracing): spans built from the probe events, exported over OTLP.
    # otlp_endpoint None: off; "": on, endpoint from the OTEL_EXPORTER_OTLP_* variables; else the
    # collector's base URL (http/protobuf: http://host:4318; grpc: host:4317).
    otlp_endpoint: str | None = None
    otlp_protocol: str | None = None  # http/protobuf (default) | grpc; None: OTEL_EXPORTER_OTLP_PROTOCOL
    trace_sample_ratio: float = 1.0   # head ratio; slow and failed requests are always kept
    export_content: bool = False      # prompt/completion text on spans (when the server sent it too)
    otlp_metrics: bool = False        # gen_ai.server.* histograms over OTLP as well
    # Captures: the bearer token of POST /api/v1/capture (None: read or create token_file, 0600).
    token: str | None = None
    token_file: str | None = None
    capture_min_interval_s: float = 30.0
    auto_capture_ttft_p99_s: float | None = None   # auto-capture rules, all off unless set
    auto_capture_kv_usage: float | None = None
    auto_capture_preemptions: int | None = None
    auto_capture_cooldown_s: float = 300.0
    # GPU telemetry: auto tries DCGM, then gpu_url (a dcgm-exporter /metrics), then NVML, then none.
    gpu_source: str = "auto"
    gpu_url: str | None = None
    gpu_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.rings and not self.discover:
            raise ConfigError("nothing to attach to: give --ring NAME (repeatable) or --discover")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if not 0.01 <= self.poll_interval_s <= 10:
            raise ConfigError(f"poll interval must be between 0.01 and 10 s, got {self.poll_interval_s}")
        for name in ("max_expert_series", "top_hot_pairs", "slow_window", "min_requests_for_p99", "retain_requests"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.trace_sample_ratio <= 1.0:
            raise ConfigError(f"trace sample ratio must be in [0, 1], got {self.trace_sample_ratio}")
        if self.otlp_protocol not in (None, "http/protobuf", "grpc"):
            raise ConfigError(f"OTLP protocol must be http/protobuf or grpc, got {self.otlp_protocol!r}")
