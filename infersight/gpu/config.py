"""The one configuration object of GPU telemetry, validated when built."""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

SOURCES = ("auto", "dcgm", "dcgm-exporter", "nvml", "none")
MIN_INTERVAL_S = 0.1  # NVML GPM needs two samples >= 100 ms apart; faster polling buys nothing


@dataclass(frozen=True)
class GpuTelemetryConfig:
    """source: auto tries DCGM, then `url` (if set), then NVML, then none; or name one.

    url: a dcgm-exporter /metrics URL (http or https). interval_s: poll period (>= 0.1 s).
    timeout_s: per-scrape / per-connect budget. ring_size: recent samples kept in memory.
    dcgm_host: where nv-hostengine listens. gpm: use NVML GPM when the GPU supports it.
    """

    source: str = "auto"
    url: str | None = None
    interval_s: float = 1.0
    timeout_s: float = 2.0
    ring_size: int = 4096
    dcgm_host: str = "127.0.0.1"
    gpm: bool = True

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        if not self.interval_s >= MIN_INTERVAL_S:
            raise ValueError(f"interval_s must be >= {MIN_INTERVAL_S}, got {self.interval_s}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.ring_size < 1:
            raise ValueError(f"ring_size must be >= 1, got {self.ring_size}")
        if self.source == "dcgm-exporter" and not self.url:
            raise ValueError("source='dcgm-exporter' needs url=")
        if self.url is not None:
            parsed = urlparse(self.url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ValueError(f"url must be an http(s) URL, got {self.url!r}")
