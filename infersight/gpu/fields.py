"""The GPU field vocabulary: every field a collector may emit, with its base unit and kind.

A field's name is the suffix of its metric: field `sm_active_ratio` is exposed as
`infersight_gpu_sm_active_ratio` (catalogue entry in `infersight.exporters.catalogue`). Units are
base units only; collectors convert (MHz -> Hz, MiB -> bytes, % -> ratio, mW -> W, mJ -> J).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

UNITS = ("ratio", "bytes", "bytes_per_second", "watts", "hertz", "joules", "celsius")


@dataclass(frozen=True)
class GpuField:
    """name: metric suffix; unit: one of UNITS; kind: gauge | counter (counters only grow)."""

    name: str
    unit: str
    kind: str
    help: str


FIELDS: tuple[GpuField, ...] = (
    GpuField("gr_engine_active_ratio", "ratio", "gauge",
             "Fraction of time the graphics/compute engine was active (DCGM 1001)."),
    GpuField("sm_active_ratio", "ratio", "gauge",
             "Fraction of time at least one warp was resident on an SM, averaged over SMs "
             "(DCGM 1002, NVML GPM SM util)."),
    GpuField("sm_occupancy_ratio", "ratio", "gauge",
             "Resident warps over the maximum warps per SM, averaged over SMs (DCGM 1003, NVML GPM)."),
    GpuField("tensor_active_ratio", "ratio", "gauge",
             "Fraction of cycles the tensor pipes were active (DCGM 1004, NVML GPM any-tensor util)."),
    GpuField("dram_active_ratio", "ratio", "gauge",
             "Fraction of cycles the device memory interface was busy (DCGM 1005, NVML GPM DRAM bandwidth util)."),
    GpuField("utilization_ratio", "ratio", "gauge",
             "Fraction of the sample period a kernel was running (coarse; DCGM 203, NVML utilization.gpu)."),
    GpuField("memory_copy_utilization_ratio", "ratio", "gauge",
             "Fraction of the sample period device memory was read or written (DCGM 204, NVML utilization.memory)."),
    GpuField("power_watts", "watts", "gauge", "Board power draw (DCGM 155, NVML power usage)."),
    GpuField("energy_joules", "joules", "counter", "Energy consumed since the driver loaded (DCGM 156, NVML)."),
    GpuField("memory_used_bytes", "bytes", "gauge", "Framebuffer memory in use (DCGM 252, NVML)."),
    GpuField("memory_free_bytes", "bytes", "gauge", "Framebuffer memory free (DCGM 251, NVML)."),
    GpuField("memory_total_bytes", "bytes", "gauge", "Framebuffer memory installed (DCGM 250, NVML)."),
    GpuField("temperature_celsius", "celsius", "gauge", "GPU die temperature (DCGM 150, NVML)."),
    GpuField("memory_temperature_celsius", "celsius", "gauge", "HBM temperature (DCGM 140)."),
    GpuField("sm_clock_hertz", "hertz", "gauge", "SM clock (DCGM 100, NVML)."),
    GpuField("memory_clock_hertz", "hertz", "gauge", "Memory clock (DCGM 101, NVML)."),
    GpuField("pcie_tx_bytes_per_second", "bytes_per_second", "gauge",
             "PCIe bytes sent by the GPU per second, headers included (DCGM 1009, NVML GPM)."),
    GpuField("pcie_rx_bytes_per_second", "bytes_per_second", "gauge",
             "PCIe bytes received by the GPU per second, headers included (DCGM 1010, NVML GPM)."),
    GpuField("nvlink_tx_bytes_per_second", "bytes_per_second", "gauge",
             "NVLink bytes sent per second over all links (DCGM 1011, NVML GPM)."),
    GpuField("nvlink_rx_bytes_per_second", "bytes_per_second", "gauge",
             "NVLink bytes received per second over all links (DCGM 1012, NVML GPM)."),
)

BY_NAME: Mapping[str, GpuField] = MappingProxyType({f.name: f for f in FIELDS})
# The activity fields the step analyses look at (tensor vs. DRAM tells compute- from memory-bound).
TENSOR = "tensor_active_ratio"
DRAM = "dram_active_ratio"
SM = "sm_active_ratio"


def unit_of(field: str) -> str:
    """The base unit of a known field ("" for an unknown name)."""
    known = BY_NAME.get(field)
    return known.unit if known else ""
