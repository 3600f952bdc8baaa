"""GPU telemetry behind one interface: DCGM, dcgm-exporter, NVML (with GPM), or nothing.

    config = GpuTelemetryConfig(source="auto", url="http://127.0.0.1:9400/metrics", interval_s=0.5)
    sampler = GpuSampler(open_collector(config), config.interval_s, config.ring_size).start()
    print(sampler.status_line())
    ...
    df = samples_frame(sampler.recent())            # ts_ns, gpu, uuid, field, value, instance
    step_averages(df, steps_df); phase_breakdown(df, steps_df)
    sampler.stop()

Module map: samples (GpuSample, GpuCollector), fields (the field vocabulary), dcgm_blanks,
dcgm_mapping (DCGM ids and exporter names), exporter_text (scrape parser), one module per
collector, detect (choice of collector), sampler, frames (DataFrame analyses), exposition
(Prometheus families), analyze (`infersight analyze` for text files). Vendor libraries (pynvml,
DCGM bindings) are imported only when a collector opens.
"""
from __future__ import annotations

from infersight.gpu.analyze import analyze_exposition, format_exposition_table
from infersight.gpu.config import GpuTelemetryConfig
from infersight.gpu.dcgm_collector import DcgmCollector
from infersight.gpu.detect import open_collector
from infersight.gpu.exporter_collector import DcgmExporterCollector, ScrapeError
from infersight.gpu.exposition import gpu_metric_families
from infersight.gpu.frames import phase_breakdown, samples_frame, step_averages
from infersight.gpu.none_collector import NoneCollector
from infersight.gpu.nvml_collector import NvmlCollector
from infersight.gpu.sampler import GpuSampler
from infersight.gpu.samples import GpuCollector, GpuSample

__all__ = [
    "GpuSample", "GpuCollector", "GpuTelemetryConfig", "GpuSampler", "open_collector",
    "DcgmCollector", "DcgmExporterCollector", "NvmlCollector", "NoneCollector", "ScrapeError",
    "samples_frame", "step_averages", "phase_breakdown", "gpu_metric_families",
    "analyze_exposition", "format_exposition_table",
]
