"""The agent's one config object, validated when built (ConfigError -> exit code 2 in the CLI)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infersight.tracing.config import TracingConfig  # light: no OpenTelemetry
from infersight.tracing.identity import IdentityConfig  # light: OpenTelemetry only when the resource is built

if TYPE_CHECKING:
    from infersight.agent.recorder.config import RecorderConfig
    from infersight.sources.vllm_kv_events import VllmKVEventsConfig


class ConfigError(ValueError):
    """A setting the agent cannot run with."""


@dataclass
class AgentConfig:
    """rings: ring names to attach; discover: also attach every infersight-* ring that appears.
    max_expert_series: per-(layer, expert) series only while layers x experts <= this; beyond it
    the exposition sums over layers and adds the top_hot_pairs hottest pairs."""

    rings: list[str] = field(default_factory=list)
    discover: bool = False
    discover_prefix: str = "infersight-"  # --discover attaches rings whose names start with this
    host: str = "127.0.0.1"
    port: int = 9464
    max_connections: int = 64  # per HTTP listener (the API, the OTLP/HTTP receiver); more: 503, counted
    poll_interval_s: float = 0.1
    parquet_dir: str | None = None
    max_expert_series: int = 512
    top_hot_pairs: int = 10
    # Slow requests (correlate.slow_rule): above the slow_quantile of the e2e of the last slow_window
    # finished requests (once min_requests_for_p99 have finished; at most that share flagged), or,
    # when any slo_*_s is set, over those SLOs (seconds) instead.
    slow_window: int = 1000
    min_requests_for_p99: int = 20
    slow_quantile: float = 0.99
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None
    slo_e2e_s: float | None = None
    retain_requests: int = 10_000  # prefix-cache groups and capture kernel times kept (counts)
    # Finished requests' rows kept for the summary, /api/v1/requests and the flight recorder: at most
    # this many bytes of row data (agent.row_window.frame_bytes), the oldest going first. ~0.5 KB a
    # row: the default keeps ~16,000 requests.
    retention_bytes: int = 8 << 20
    # The agent's own caps on what a producer sends (agent.record_limits): distinct task labels over all
    # rings (beyond: "other", counted), MoE layer ids and experts per layer (beyond: the record is refused).
    max_task_labels: int = 64
    max_moe_layers: int = 256
    max_moe_experts: int = 1024
    vllm_compat: bool = False
    model_name: str = "tiny-moe"
    retry_interval_s: float = 2.0
    # Tracing (opt-in; infersight.tracing): spans built from the probe events, exported over OTLP, and
    # the receiver of an engine's own spans. Its own config object, validated when built.
    tracing: TracingConfig = field(default_factory=TracingConfig)
    # Identity (tracing.identity): the OpenTelemetry resource of every span, OTLP metric and target_info;
    # from OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME (the pod's downward API fills them), these defaults beneath.
    identity: IdentityConfig = field(default_factory=IdentityConfig)
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
    # Energy per request: the GPUs the engine runs on, whose energy counters are split over its steps
    # (empty: every GPU with an energy counter; give them when other work shares the host's GPUs).
    energy_gpus: tuple[int, ...] = ()
    # vLLM's KV cache events (infersight.sources.vllm_kv_events): the endpoint and replay endpoint as
    # given to vLLM's --kv-events-config (tcp://HOST:PORT), and its topic. None: off. A replay without an
    # answer for vllm_kv_replay_timeout_s is given up (its holes counted lost); vLLM answers from its
    # engine process, which a loaded host can keep off the CPU for seconds (VllmKVEventsConfig's default).
    vllm_kv_events: str | None = None
    vllm_kv_replay: str | None = None
    vllm_kv_topic: str = "kv"
    vllm_kv_replay_timeout_s: float = 5.0
    # The KV ledger's table of remembered block ids, allocated whole at start (vllm_kv_remembered).
    vllm_kv_remember_bytes: int = 8 << 20
    # An unmodified vLLM (infersight.sources.vllm_metrics / vllm_profiler): its base URL; /metrics is
    # scraped every vllm_metrics_interval_s and served under our names. With vllm_profiler_dir (its
    # torch_profiler_dir as this host sees it) captures go through /start_profile and /stop_profile;
    # vllm_capture_wait_s bounds both the wait for the steps and the wait for the trace file.
    vllm_url: str | None = None
    vllm_metrics_interval_s: float = 2.0
    vllm_profiler_dir: str | None = None
    vllm_capture_wait_s: float = 60.0
    # The flight recorder (agent.recorder.flight_recorder): sampled kernel windows inside an overhead budget, and
    # full captures on a latency-objective breach or an anomaly. None: off. Its own config validates.
    flight_recorder: "RecorderConfig | None" = None

    def vllm_kv_config(self) -> "VllmKVEventsConfig":
        """The KV event subscriber's config (ValueError when a bound is wrong); needs vllm_kv_events."""
        from infersight.sources.vllm_kv_events import VllmKVEventsConfig  # zmq only when asked

        assert self.vllm_kv_events is not None
        return VllmKVEventsConfig(self.vllm_kv_events, self.vllm_kv_replay, self.vllm_kv_topic,
                                  replay_timeout_s=self.vllm_kv_replay_timeout_s,
                                  remember_bytes=self.vllm_kv_remember_bytes)

    def __post_init__(self) -> None:
        if not self.rings and not self.discover and not self.vllm_kv_events and not self.vllm_url:
            raise ConfigError("nothing to attach to: give --ring NAME (repeatable), --discover, --vllm-kv-events "
                              "or --vllm-url")
        if self.vllm_url is not None and not self.vllm_url.startswith(("http://", "https://")):
            raise ConfigError(f"--vllm-url must be an http(s) base URL such as http://127.0.0.1:8000, got "
                              f"{self.vllm_url!r}")
        if not 0.1 <= self.vllm_metrics_interval_s <= 300:
            raise ConfigError("--vllm-metrics-interval must be between 0.1 and 300 s, "
                              f"got {self.vllm_metrics_interval_s}")
        if self.vllm_profiler_dir is not None and not self.vllm_url:
            raise ConfigError("--vllm-profiler-dir needs --vllm-url (the server whose profiler writes there)")
        if not 1 <= self.vllm_capture_wait_s <= 3600:
            raise ConfigError(f"the vLLM capture wait must be between 1 and 3600 s, got {self.vllm_capture_wait_s}")
        if self.vllm_kv_replay and not self.vllm_kv_events:
            raise ConfigError("--vllm-kv-replay needs --vllm-kv-events")
        if not 0.01 <= self.vllm_kv_replay_timeout_s <= 60:
            raise ConfigError("--vllm-kv-replay-timeout must be between 0.01 and 60 s, "
                              f"got {self.vllm_kv_replay_timeout_s}")
        if self.vllm_kv_events:
            try:
                self.vllm_kv_config()
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if not 0.01 <= self.poll_interval_s <= 10:
            raise ConfigError(f"poll interval must be between 0.01 and 10 s, got {self.poll_interval_s}")
        for name in ("max_expert_series", "top_hot_pairs", "slow_window", "min_requests_for_p99", "retain_requests",
                     "retention_bytes", "max_task_labels", "max_moe_layers", "max_moe_experts"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.slow_quantile < 1.0:
            raise ConfigError(f"slow quantile must be in (0, 1), got {self.slow_quantile}")
        for name in ("slo_ttft_s", "slo_itl_s", "slo_e2e_s"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 s, got {getattr(self, name)}")
        if not 1 <= self.max_connections <= 65536:
            raise ConfigError(f"max connections must be in 1..65536, got {self.max_connections}")
        self.energy_gpus = tuple(self.energy_gpus)
        if any(not isinstance(g, int) or g < 0 for g in self.energy_gpus):
            raise ConfigError(f"energy GPUs are device indices >= 0, got {self.energy_gpus}")
