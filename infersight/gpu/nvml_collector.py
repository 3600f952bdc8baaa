"""Collector over NVML (nvidia-ml-py, `import pynvml`): device counters plus GPM on Hopper and newer.

Per poll and per GPU: utilisation (% -> ratio), memory (bytes), power (mW -> W), SM and memory
clocks (MHz -> Hz), GPU and memory temperature, total energy (mJ -> J). With GPM (GPU Performance Monitoring,
`nvmlGpmQueryDeviceSupport`), the profiler-grade activity ratios too: each comes from two GPM
samples taken at least `gpm_min_interval_s` (100 ms) apart, so a poll that arrives sooner skips
GPM and waits for the window to fill.

    poll k-1                     poll k
    SampleGet(previous) ......... SampleGet(current); MetricsGet(previous, current); swap

A field the device does not support (NVML_ERROR_NOT_SUPPORTED) is skipped from then on; any
other NVML error propagates for the sampler to count. Processes are never listed: per-process
queries are costly and none of these fields needs them.
"""
from __future__ import annotations

import importlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from infersight.gpu.samples import GpuSample

MIB = float(1 << 20)
# (pynvml constant, field, scale to base units). GPM utilisations are 0-100, bandwidths MiB/s.
GPM_METRICS: tuple[tuple[str, str, float], ...] = (
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", "gr_engine_active_ratio", 0.01),
    ("NVML_GPM_METRIC_SM_UTIL", "sm_active_ratio", 0.01),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy_ratio", 0.01),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor_active_ratio", 0.01),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_active_ratio", 0.01),
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "pcie_tx_bytes_per_second", MIB),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", "pcie_rx_bytes_per_second", MIB),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "nvlink_tx_bytes_per_second", MIB),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "nvlink_rx_bytes_per_second", MIB),
)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# Basic readers: name -> function(nvml, handle) -> [(field, value in base units)].
def _utilization(nvml: Any, h: Any) -> list[tuple[str, float]]:
    u = nvml.nvmlDeviceGetUtilizationRates(h)
    return [("utilization_ratio", u.gpu / 100.0), ("memory_copy_utilization_ratio", u.memory / 100.0)]


def _memory(nvml: Any, h: Any) -> list[tuple[str, float]]:
    m = nvml.nvmlDeviceGetMemoryInfo(h)
    return [("memory_used_bytes", float(m.used)), ("memory_free_bytes", float(m.free)),
            ("memory_total_bytes", float(m.total))]


def _power(nvml: Any, h: Any) -> list[tuple[str, float]]:
    return [("power_watts", nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)]  # milliwatts


def _energy(nvml: Any, h: Any) -> list[tuple[str, float]]:
    return [("energy_joules", nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0)]  # millijoules


def _clocks(nvml: Any, h: Any) -> list[tuple[str, float]]:
    return [("sm_clock_hertz", nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) * 1e6),  # MHz
            ("memory_clock_hertz", nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM) * 1e6)]


def _temperature(nvml: Any, h: Any) -> list[tuple[str, float]]:
    return [("temperature_celsius", float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)))]


#: The member of NVML's value union that holds each nvmlValueType_t (double, uint, ulong, ...).
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _memory_temperature(nvml: Any, h: Any) -> list[tuple[str, float]]:
    """HBM temperature, a field value (NVML_FI_DEV_MEMORY_TEMP): a device without it answers in the
    field's own return code, which is taken as not supported (so it is not asked again)."""
    if not hasattr(nvml, "nvmlDeviceGetFieldValues"):
        raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
    value = nvml.nvmlDeviceGetFieldValues(h, [nvml.NVML_FI_DEV_MEMORY_TEMP])[0]
    if value.nvmlReturn != nvml.NVML_SUCCESS or not 0 <= value.valueType < len(VALUE_MEMBERS):
        raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
    return [("memory_temperature_celsius", float(getattr(value.value, VALUE_MEMBERS[value.valueType])))]


READERS: tuple[tuple[str, Callable[[Any, Any], list[tuple[str, float]]]], ...] = (
    ("utilization", _utilization), ("memory", _memory), ("power", _power), ("energy", _energy),
    ("clocks", _clocks), ("temperature", _temperature), ("memory_temperature", _memory_temperature))


@dataclass
class _Gpm:
    previous: Any
    current: Any
    previous_ns: int
    stale: bool = False  # the window spans a pause: take a fresh first sample before reading


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str
    gpm: _Gpm | None
    unsupported: set[str] = field(default_factory=set)


class NvmlCollector:
    """Polls every GPU NVML sees. `nvml` is the pynvml module or a stand-in (tests inject a fake)."""

    name = "nvml"

    def __init__(self, nvml: Any | None = None, gpm: bool = True, gpm_min_interval_s: float = 0.1,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        self._clock = clock
        self._gpm_min_ns = int(gpm_min_interval_s * 1e9)
        self._gpm_paused = False
        self._closed = False
        nv = self._nvml
        nv.nvmlInit()
        try:
            self._gpm_ids = [(getattr(nv, const), fld, scale) for const, fld, scale in GPM_METRICS
                             if hasattr(nv, const)]
            self._devices = [self._open_device(i, gpm) for i in range(nv.nvmlDeviceGetCount())]
        except BaseException:
            nv.nvmlShutdown()
            raise

    def _not_supported(self, e: BaseException) -> bool:
        nv = self._nvml
        return isinstance(e, nv.NVMLError) and getattr(e, "value", None) == nv.NVML_ERROR_NOT_SUPPORTED

    def _open_device(self, index: int, want_gpm: bool) -> _Device:
        nv = self._nvml
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        dev = _Device(index, handle, _text(nv.nvmlDeviceGetUUID(handle)), _text(nv.nvmlDeviceGetName(handle)), None)
        if want_gpm and self._gpm_ids and hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            try:
                supported = bool(nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            except nv.NVMLError:
                supported = False  # pre-Hopper driver paths answer with an error, not a flag
            if supported:
                previous, current = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
                nv.nvmlGpmSampleGet(handle, previous)
                dev.gpm = _Gpm(previous, current, self._clock())
        return dev

    def _read_gpm(self, dev: _Device, gpm: _Gpm, now: int) -> list[tuple[str, float]]:
        nv = self._nvml
        nv.nvmlGpmSampleGet(dev.handle, gpm.current)
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._gpm_ids)
        request.sample1, request.sample2 = gpm.previous, gpm.current
        for i, (metric_id, _, _) in enumerate(self._gpm_ids):
            request.metrics[i].metricId = metric_id
        nv.nvmlGpmMetricsGet(request)
        # The newer sample becomes the start of the next window; its buffer is reused.
        gpm.previous, gpm.current, gpm.previous_ns = gpm.current, gpm.previous, now
        out = []
        for i, (_, fld, scale) in enumerate(self._gpm_ids):
            metric = request.metrics[i]
            if metric.nvmlReturn == nv.NVML_SUCCESS and not math.isnan(metric.value):
                out.append((fld, float(metric.value) * scale))
        return out

    def poll(self) -> list[GpuSample]:
        now = self._clock()
        samples: list[GpuSample] = []
        for dev in self._devices:
            values: list[tuple[str, float]] = []
            for reader_name, reader in READERS:
                if reader_name in dev.unsupported:
                    continue
                try:
                    values.extend(reader(self._nvml, dev.handle))
                except Exception as e:
                    if not self._not_supported(e):
                        raise
                    dev.unsupported.add(reader_name)
            gpm = dev.gpm
            if gpm is not None and gpm.stale and not self._gpm_paused:
                self._nvml.nvmlGpmSampleGet(dev.handle, gpm.previous)
                gpm.previous_ns, gpm.stale = now, False
            elif gpm is not None and not self._gpm_paused and now - gpm.previous_ns >= self._gpm_min_ns:
                values.extend(self._read_gpm(dev, gpm, now))
            samples.extend(GpuSample(dev.index, dev.uuid, fld, v, now) for fld, v in values)
        return samples

    def set_profiling_paused(self, paused: bool) -> None:
        """While paused no GPM sample is taken (Nsight tools need the performance monitors); the
        device counters (utilisation, memory, power, clocks) go on. On resume GPM starts a fresh
        window, so no reading spans the pause."""
        self._gpm_paused = paused
        if not paused:
            for dev in self._devices:
                if dev.gpm is not None:
                    dev.gpm.stale = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        nv = self._nvml
        for dev in self._devices:
            if dev.gpm is not None:
                nv.nvmlGpmSampleFree(dev.gpm.previous)
                nv.nvmlGpmSampleFree(dev.gpm.current)
        nv.nvmlShutdown()

    def status_line(self) -> str:
        if not self._devices:
            return "GPU telemetry: nvml, no GPUs visible"
        names = sorted({d.name for d in self._devices})
        gpm = sum(d.gpm is not None for d in self._devices)
        note = (f"GPM {'paused' if self._gpm_paused else 'on'} {gpm}/{len(self._devices)}" if gpm else
                "no GPM (pre-Hopper or disabled): SM/tensor/DRAM activity unavailable")
        missing = sorted({r for d in self._devices for r in d.unsupported})
        tail = f"; not supported: {', '.join(missing)}" if missing else ""
        return f"GPU telemetry: nvml, {len(self._devices)} GPU(s) ({', '.join(names)}), {note}{tail}"
