"""GpuConfig: the agent's GPU part (agent.parts.GpuPart, gpu.sampler, agent.folds.energy_account):
telemetry and energy settings, and their CLI flag group."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from urllib.parse import urlparse

from typing import TYPE_CHECKING

from infersight.config_error import ConfigError

if TYPE_CHECKING:
    from infersight.gpu.config import GpuTelemetryConfig

# gpu.config's SOURCES and MIN_INTERVAL_S (tests/agent/test_agent_config_groups.py checks they agree):
# importing infersight.gpu loads pandas, a second of the CLI's start for every command.
SOURCES = ("auto", "dcgm", "dcgm-exporter", "nvml", "none")
MIN_INTERVAL_S = 0.1
#: correlate.token_cost.MIN_FIT_SPAN_NS (tests/agent/test_energy_fit.py checks they agree; importing
#: token_cost here would load pandas for every command's start).
MIN_FIT_SPAN_NS = 900_000_000
#: Where the energy model's static power comes from (GpuConfig.energy_static).
ENERGY_STATIC = ("idle", "fitted")


@dataclass(frozen=True)
class GpuConfig:
    """source: auto tries DCGM, then `url` (a dcgm-exporter /metrics), then NVML, then none; or name one.
    interval_s: the sampling period. energy_gpus: the GPUs the engine runs on, whose energy counters
    are split over its steps (empty: every GPU with an energy counter; give them when other work
    shares the host's GPUs). energy_fit_min_s: the shortest counter interval the energy model is
    fitted on; shorter ones are merged (why: correlate.token_cost.MIN_FIT_SPAN_NS; 0 for a counter
    that does not lag the work, as a test's fake). energy_static: "idle" holds the model's static
    power at the GPU's idle power once the agent has measured some (no step running; why:
    correlate.token_cost), "fitted" always fits it."""

    source: str = "auto"
    url: str | None = None
    interval_s: float = 1.0
    energy_gpus: tuple[int, ...] = ()
    energy_fit_min_s: float = MIN_FIT_SPAN_NS / 1e9
    energy_static: str = "idle"

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ConfigError(f"--gpu-source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if not self.interval_s >= MIN_INTERVAL_S:
            raise ConfigError(f"--gpu-interval must be >= {MIN_INTERVAL_S} s, got {self.interval_s}")
        if self.url is not None:
            parsed = urlparse(self.url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ConfigError(f"--gpu-url must be an http(s) URL, got {self.url!r}")
        if self.source == "dcgm-exporter" and not self.url:
            raise ConfigError("--gpu-source dcgm-exporter needs --gpu-url")
        if not 0 <= self.energy_fit_min_s <= 3600:
            raise ConfigError(f"--energy-fit-min-interval must be in [0, 3600] s, got {self.energy_fit_min_s}")
        if self.energy_static not in ENERGY_STATIC:
            raise ConfigError(f"--energy-static must be one of {', '.join(ENERGY_STATIC)}, got {self.energy_static!r}")
        object.__setattr__(self, "energy_gpus", tuple(self.energy_gpus))
        if any(not isinstance(g, int) or g < 0 for g in self.energy_gpus):
            raise ConfigError(f"--energy-gpus takes device indices >= 0, got {self.energy_gpus}")

    def telemetry(self) -> GpuTelemetryConfig:
        """The sampler's config (its other settings at their defaults)."""
        from infersight.gpu.config import GpuTelemetryConfig

        return GpuTelemetryConfig(self.source, self.url, self.interval_s)

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        gpu = parser.add_argument_group("GPU telemetry and energy per request")
        gpu.add_argument("--gpu-source", default="auto", choices=SOURCES,
                         help="auto: DCGM, then --gpu-url, then NVML, then none")
        gpu.add_argument("--gpu-url", metavar="URL", help="a dcgm-exporter /metrics URL")
        gpu.add_argument("--gpu-interval", type=float, default=1.0, metavar="SECONDS",
                         help="GPU sampling interval (>= 0.1 s; default 1)")
        gpu.add_argument("--energy-gpus", default="", metavar="0,1",
                         help="the GPUs the engine runs on, whose energy is split over its steps (default: all)")
        gpu.add_argument("--energy-fit-min-interval", type=float, default=MIN_FIT_SPAN_NS / 1e9, metavar="SECONDS",
                         help="the energy model is fitted on counter intervals at least this long; shorter "
                              "readings are merged (a GPU's counter lags its work; default 0.9)")
        gpu.add_argument("--energy-static", default="idle", choices=ENERGY_STATIC,
                         help="the energy model's static power: idle holds it at the GPU's measured idle power "
                              "once some idle has been read (dynamic = energy above idle), fitted always fits "
                              "it (default idle)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GpuConfig:
        return cls(args.gpu_source, args.gpu_url, args.gpu_interval, parse_gpu_list(args.energy_gpus),
                   args.energy_fit_min_interval, args.energy_static)


def parse_gpu_list(value: str) -> tuple[int, ...]:
    """--energy-gpus: comma-separated device indices ("" for all); ConfigError (exit 2) otherwise."""
    try:
        gpus = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        gpus = (-1,)
    if value.strip() and (not gpus or min(gpus) < 0):
        raise ConfigError(f"--energy-gpus takes device indices such as 0,1, got {value!r}")
    return gpus
