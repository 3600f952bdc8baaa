"""The agent's config: its own few settings and one config object per component, each validated when
built (ConfigError -> exit code 2 in the CLI) and owning its CLI flag group (commands/agent.py composes
them). See /docs/architecture.md for the components."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infersight.agent.autoapply.config import AutoApplyConfig
from infersight.agent.capture.config import CaptureConfig
from infersight.agent.rings.engine_label_config import EngineLabelConfig
from infersight.agent.rings.limits_config import RecordLimits
from infersight.agent.rows.retention_config import RetentionConfig
from infersight.agent.slow.config import SlowRequestConfig
from infersight.config_error import ConfigError
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.agent.gpu_config import GpuConfig
from infersight.sources.vllm.kv_config import VllmKvConfig
from infersight.sources.vllm.http_config import VllmHttpConfig
from infersight.tracing.config import TracingConfig  # light: no OpenTelemetry
from infersight.tracing.identity import IdentityConfig  # light: OpenTelemetry only when the resource is built

if TYPE_CHECKING:
    from infersight.agent.recorder.config import RecorderConfig

__all__ = ["AgentConfig", "ConfigError"]


@dataclass
class AgentConfig:
    """rings: ring names to attach; discover: also attach every ring whose name starts with
    discover_prefix that appears (retried every retry_interval_s). host, port: the API and /metrics
    listener, max_connections each for it and the OTLP/HTTP receiver (more: 503, counted).
    parquet_dir: per-request rows and event frames written there (None: off). The rest: one config
    object per component, each validated when built."""

    rings: list[str] = field(default_factory=list)
    discover: bool = False
    discover_prefix: str = "infersight-"
    host: str = "127.0.0.1"
    port: int = 9464
    max_connections: int = 64
    poll_interval_s: float = 0.1
    parquet_dir: str | None = None
    retry_interval_s: float = 2.0
    exposition: ExpositionConfig = field(default_factory=ExpositionConfig)  # exporters.prometheus
    slow: SlowRequestConfig = field(default_factory=SlowRequestConfig)  # agent.slow_judge
    retention: RetentionConfig = field(default_factory=RetentionConfig)  # agent.state's folds
    limits: RecordLimits = field(default_factory=RecordLimits)  # agent.rings.record_limits
    # Tracing (opt-in; infersight.tracing): spans built from the probe events, exported over OTLP, and
    # the receiver of an engine's own spans.
    tracing: TracingConfig = field(default_factory=TracingConfig)
    # Identity (tracing.identity): the OpenTelemetry resource of every span, OTLP metric and target_info;
    # from OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME (the pod's downward API fills them), these defaults beneath.
    identity: IdentityConfig = field(default_factory=IdentityConfig)
    captures: CaptureConfig = field(default_factory=CaptureConfig)  # agent.capture
    gpu: GpuConfig = field(default_factory=GpuConfig)  # gpu.sampler, agent.folds.energy_account
    vllm_kv: VllmKvConfig = field(default_factory=VllmKvConfig)  # sources.vllm.kv_events (off by default)
    vllm_server: VllmHttpConfig = field(default_factory=VllmHttpConfig)  # sources.vllm.scraper (off by default)
    # The flight recorder (agent.recorder.flight_recorder): sampled kernel windows inside an overhead budget, and
    # full captures on a latency-objective breach or an anomaly. None: off. Its own config validates.
    flight_recorder: "RecorderConfig | None" = None
    auto_apply: AutoApplyConfig = field(default_factory=AutoApplyConfig)  # agent.autoapply (off by default)
    engine_label: EngineLabelConfig = field(default_factory=EngineLabelConfig)  # agent.rings.engine_scope

    def __post_init__(self) -> None:
        if not self.rings and not self.discover and not self.vllm_kv.enabled and not self.vllm_server.enabled:
            raise ConfigError("nothing to attach to: give --ring NAME (repeatable), --discover, --vllm-kv-events "
                              "or --vllm-url")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if not 0.01 <= self.poll_interval_s <= 10:
            raise ConfigError(f"poll interval must be between 0.01 and 10 s, got {self.poll_interval_s}")
        if not 1 <= self.max_connections <= 65536:
            raise ConfigError(f"max connections must be in 1..65536, got {self.max_connections}")
        if not self.retry_interval_s > 0:
            raise ConfigError(f"the ring retry interval must be > 0 s, got {self.retry_interval_s}")
