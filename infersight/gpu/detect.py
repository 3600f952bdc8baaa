"""Pick the collector: DCGM, then a configured dcgm-exporter URL, then NVML, then none.

`open_collector` never raises: a source that cannot open is recorded as a reason, and when
nothing opens the result is a NoneCollector whose status line lists those reasons. Naming one
source in the config skips the others (source="none" turns telemetry off). Libraries and the URL
opener are injectable so the order can be tested without a GPU.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from infersight.gpu.config import GpuTelemetryConfig
from infersight.gpu.dcgm_collector import DcgmBindings, DcgmCollector
from infersight.gpu.exporter_collector import DcgmExporterCollector, Opener
from infersight.gpu.none_collector import NoneCollector
from infersight.gpu.nvml_collector import NvmlCollector
from infersight.gpu.samples import GpuCollector
from infersight.gpu.selection import GpuSelection

log = logging.getLogger(__name__)


def _order(config: GpuTelemetryConfig) -> list[str]:
    if config.source != "auto":
        return [config.source]
    return ["dcgm", *(["dcgm-exporter"] if config.url else []), "nvml"]


def open_collector(config: GpuTelemetryConfig, *, dcgm_bindings: DcgmBindings | None = None,
                   nvml: Any | None = None, opener: Opener | None = None,
                   selection: GpuSelection | None = None) -> GpuCollector:
    """The first source in the configured order that opens; NoneCollector if none does. selection:
    which of a dcgm-exporter's GPUs are the engine's (gpu.selection; None: all)."""
    if config.source == "none":
        return NoneCollector()
    builders: dict[str, Callable[[], GpuCollector]] = {
        "dcgm": lambda: DcgmCollector(config.dcgm_host, config.interval_s, dcgm_bindings,
                                      connect_timeout_ms=int(config.timeout_s * 1000)),
        "dcgm-exporter": lambda: DcgmExporterCollector(config.url or "", config.timeout_s, opener,
                                                       selection=selection),
        "nvml": lambda: NvmlCollector(nvml, gpm=config.gpm),
    }
    reasons: list[str] = []
    for source in _order(config):
        try:
            collector = builders[source]()
            if config.source == "auto" and source == "dcgm-exporter":
                collector.poll()  # auto only keeps an exporter that answers now; errors fall through
        except Exception as e:  # a library's own error types: ImportError, NVMLError, DCGMError, ScrapeError
            reasons.append(f"{source}: {type(e).__name__}: {e}")
            log.info("GPU telemetry: %s unavailable: %s", source, e)
            continue
        log.info("%s", collector.status_line())
        return collector
    return NoneCollector(tuple(reasons))
