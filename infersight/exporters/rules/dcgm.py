"""dcgm-exporter's series the GPU alerts read. They are not infersight's (the node's dcgm-exporter
DaemonSet serves them), so they are not in the catalogue; they are named here once.

dcgm-exporter keeps DCGM's field names and adds no _total to counters. XID_ERRORS is in its
default counters (a gauge holding the last XID code seen, 0 for none). The two violation counters
are commented out in the default-counters.csv of 4.x and must be enabled for the throttling alerts
(a line each in the exporter's CSV). Their unit is microseconds of throttled time, as DCGM's
dcgm_fields.h states for fields 240 and 241 (some exporter CSVs say ns; dcgm_fields.h is the source).
Exporter 4.9 renamed 23 fields to DCGM 4.7 names; these three were not among the renamed ones
(infersight.gpu.dcgm_mapping lists the renames).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DcgmSeries:
    name: str
    kind: str  # gauge | counter (exposed under its own name, no _total)
    help: str
    to_base: float = 1.0  # value * to_base = base units


XID_ERRORS = DcgmSeries("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered (0: none).")
THERMAL_VIOLATION = DcgmSeries("DCGM_FI_DEV_THERMAL_VIOLATION", "counter",
                               "Time throttled by thermal constraints, in microseconds.", 1e-6)
POWER_VIOLATION = DcgmSeries("DCGM_FI_DEV_POWER_VIOLATION", "counter",
                             "Time throttled by power constraints, in microseconds.", 1e-6)
DCGM_SERIES = (XID_ERRORS, THERMAL_VIOLATION, POWER_VIOLATION)
