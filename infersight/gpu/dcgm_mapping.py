"""DCGM field ids and dcgm-exporter metric names -> infersight fields, with the scale to base units.

Two exporter naming schemes exist:

legacy (dcgm-exporter before 4.9): the DCGM 3.x/4.x field names, in the units DCGM has always
    used: DCGM_FI_DEV_GPU_UTIL in percent, DCGM_FI_DEV_FB_USED in MiB, DCGM_FI_DEV_SM_CLOCK in MHz,
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION in mJ, DCGM_FI_PROF_*_ACTIVE as 0..1 ratios. Labels
    `gpu`, `UUID`, `device`, `modelName`, `pci_bus_id`, `Hostname` (renamed `hostname` in 4.8.3),
    `DCGM_FI_DRIVER_VERSION`, and for MIG `GPU_I_PROFILE`, `GPU_I_ID`.
"4.9" (dcgm-exporter 4.9.0 and later): the DCGM 4.7 names, eleven of them with new base units.

What the 4.9 table rests on (read through the search tool, 2026):
- dcgm-exporter 4.9.0 release notes (newreleases.io mirror of the GitHub release): "Rename the 23
  default and profiling-preset fields that DCGM 4.7 deprecates to their new DCGM 4.7 names. Eleven
  of them also change unit: clocks from MHz to hertz, energy from millijoules to joules,
  utilization from a percentage to a 0 to 1 ratio, GPU memory from MiB to bytes, and NVLink
  throughput from MB/s to bytes per second"; the driver label becomes
  DCGM_FI_SYSTEM_DRIVER_VERSION; DCGM_FI_DEV_FB_CAPACITY_BYTES is collected by default.
- NVIDIA/DCGM dcgmlib/dcgm_fields.h (v4.6.0), the "renamed per DCGM Field Naming Standard" alias
  block: same-unit renames keep their ids (DCGM_FI_DEV_POWER_USAGE -> DCGM_FI_DEV_BOARD_POWER_WATTS
  155, DCGM_FI_DEV_GPU_TEMP -> DCGM_FI_DEV_GPU_TEMP_CELSIUS 150, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE ->
  DCGM_FI_PROF_TENSOR_UTIL_RATIO 1004, and the other DCGM_FI_PROF_*_UTIL_RATIO 1001-1005).
- NVIDIA/go-dcgm base-unit field tests: new ids for new units, DCGM_FI_DEV_SM_CLOCK_HERTZ 1603,
  DCGM_FI_DEV_MEMORY_CLOCK_HERTZ 1604, DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL 1611.
- A third-party DCGM guide (jackliusr/research, citing the DCGM 4.7 Field Identifiers page) for
  the ids we could not read in NVIDIA's own files: DCGM_FI_DEV_GPU_UTIL_RATIO 1613,
  DCGM_FI_DEV_MEMORY_UTIL_RATIO 1614, DCGM_FI_DEV_FB_CAPACITY_BYTES/FREE/USED 1625/1626/1627.
Assumption: the 4.9 exporter emits exactly these canonical names for the fields we use. The
4.9.0 default CSV itself was not in the index; we match on names, so a wrong id would only
mislabel `field_id`, never a value.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

MIB = float(1 << 20)


@dataclass(frozen=True)
class DcgmName:
    """One exporter metric name: its DCGM field id, our field, value * scale = base units."""

    name: str
    field_id: int
    field: str
    scale: float
    scheme: str  # legacy | 4.9 | both


NAMES: tuple[DcgmName, ...] = (
    # -- legacy names, legacy units --------------------------------------------------------------
    DcgmName("DCGM_FI_DEV_SM_CLOCK", 100, "sm_clock_hertz", 1e6, "legacy"),           # MHz
    DcgmName("DCGM_FI_DEV_MEM_CLOCK", 101, "memory_clock_hertz", 1e6, "legacy"),      # MHz
    DcgmName("DCGM_FI_DEV_MEMORY_TEMP", 140, "memory_temperature_celsius", 1.0, "legacy"),
    DcgmName("DCGM_FI_DEV_GPU_TEMP", 150, "temperature_celsius", 1.0, "legacy"),
    DcgmName("DCGM_FI_DEV_POWER_USAGE", 155, "power_watts", 1.0, "legacy"),           # W already
    DcgmName("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 156, "energy_joules", 1e-3, "legacy"),  # mJ
    DcgmName("DCGM_FI_DEV_GPU_UTIL", 203, "utilization_ratio", 0.01, "legacy"),       # percent
    DcgmName("DCGM_FI_DEV_MEM_COPY_UTIL", 204, "memory_copy_utilization_ratio", 0.01, "legacy"),
    DcgmName("DCGM_FI_DEV_FB_TOTAL", 250, "memory_total_bytes", MIB, "legacy"),       # MiB
    DcgmName("DCGM_FI_DEV_FB_FREE", 251, "memory_free_bytes", MIB, "legacy"),
    DcgmName("DCGM_FI_DEV_FB_USED", 252, "memory_used_bytes", MIB, "legacy"),
    DcgmName("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1001, "gr_engine_active_ratio", 1.0, "legacy"),
    DcgmName("DCGM_FI_PROF_SM_ACTIVE", 1002, "sm_active_ratio", 1.0, "legacy"),
    DcgmName("DCGM_FI_PROF_SM_OCCUPANCY", 1003, "sm_occupancy_ratio", 1.0, "legacy"),
    DcgmName("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1004, "tensor_active_ratio", 1.0, "legacy"),
    DcgmName("DCGM_FI_PROF_DRAM_ACTIVE", 1005, "dram_active_ratio", 1.0, "legacy"),
    # -- unchanged by the rename: rates in bytes per second -------------------------------------
    DcgmName("DCGM_FI_PROF_PCIE_TX_BYTES", 1009, "pcie_tx_bytes_per_second", 1.0, "both"),
    DcgmName("DCGM_FI_PROF_PCIE_RX_BYTES", 1010, "pcie_rx_bytes_per_second", 1.0, "both"),
    DcgmName("DCGM_FI_PROF_NVLINK_TX_BYTES", 1011, "nvlink_tx_bytes_per_second", 1.0, "both"),
    DcgmName("DCGM_FI_PROF_NVLINK_RX_BYTES", 1012, "nvlink_rx_bytes_per_second", 1.0, "both"),
    # -- dcgm-exporter 4.9: DCGM 4.7 names, base units ------------------------------------------
    DcgmName("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1603, "sm_clock_hertz", 1.0, "4.9"),
    DcgmName("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", 1604, "memory_clock_hertz", 1.0, "4.9"),
    DcgmName("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", 140, "memory_temperature_celsius", 1.0, "4.9"),
    DcgmName("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 150, "temperature_celsius", 1.0, "4.9"),
    DcgmName("DCGM_FI_DEV_BOARD_POWER_WATTS", 155, "power_watts", 1.0, "4.9"),
    DcgmName("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1611, "energy_joules", 1.0, "4.9"),
    DcgmName("DCGM_FI_DEV_GPU_UTIL_RATIO", 1613, "utilization_ratio", 1.0, "4.9"),
    DcgmName("DCGM_FI_DEV_MEMORY_UTIL_RATIO", 1614, "memory_copy_utilization_ratio", 1.0, "4.9"),
    DcgmName("DCGM_FI_DEV_FB_CAPACITY_BYTES", 1625, "memory_total_bytes", 1.0, "4.9"),
    DcgmName("DCGM_FI_DEV_FB_FREE_BYTES", 1626, "memory_free_bytes", 1.0, "4.9"),
    DcgmName("DCGM_FI_DEV_FB_USED_BYTES", 1627, "memory_used_bytes", 1.0, "4.9"),
    DcgmName("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", 1001, "gr_engine_active_ratio", 1.0, "4.9"),
    DcgmName("DCGM_FI_PROF_SM_UTIL_RATIO", 1002, "sm_active_ratio", 1.0, "4.9"),
    DcgmName("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", 1003, "sm_occupancy_ratio", 1.0, "4.9"),
    DcgmName("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1004, "tensor_active_ratio", 1.0, "4.9"),
    DcgmName("DCGM_FI_PROF_DRAM_UTIL_RATIO", 1005, "dram_active_ratio", 1.0, "4.9"),
)

BY_EXPORTER_NAME: Mapping[str, DcgmName] = MappingProxyType({n.name: n for n in NAMES})

# What the DCGM collector watches: the legacy numeric ids, served by every DCGM from 2.x to 4.7,
# read in DCGM's own units and scaled like the legacy exporter names above.
WATCHED_FIELD_IDS: tuple[int, ...] = tuple(n.field_id for n in NAMES if n.scheme in ("legacy", "both"))
BY_FIELD_ID: Mapping[int, DcgmName] = MappingProxyType(
    {n.field_id: n for n in NAMES if n.scheme in ("legacy", "both")})

# Labels whose spelling changed between exporter releases: first match wins.
UUID_LABELS = ("UUID", "uuid")
HOSTNAME_LABELS = ("hostname", "Hostname")      # Hostname before 4.8.3, hostname after
DRIVER_LABELS = ("DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DRIVER_VERSION")  # renamed in 4.9
MIG_INSTANCE_LABEL = "GPU_I_ID"
MIG_PROFILE_LABEL = "GPU_I_PROFILE"


def first_label(labels: Mapping[str, str], names: tuple[str, ...]) -> str:
    """The value of the first of `names` present in `labels` ("" if none)."""
    for name in names:
        if name in labels:
            return labels[name]
    return ""
