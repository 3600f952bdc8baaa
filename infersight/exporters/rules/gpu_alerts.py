"""Alerts on GPU faults from the node's dcgm-exporter: an XID error, and time lost to thermal or
power throttling. They cover every GPU the exporter reports (a fault on a node's GPU is a fault
whichever pod holds it); dcgm-exporter's pod mapping adds `namespace` and `pod` where a GPU is
assigned, and the description names them."""
from __future__ import annotations

from infersight.exporters.rules import runbook as R
from infersight.exporters.rules.config import RulesConfig
from infersight.exporters.rules.dcgm import POWER_VIOLATION, THERMAL_VIOLATION, XID_ERRORS, DcgmSeries
from infersight.exporters.rules.rule import Alert

#: Which GPU, as dcgm-exporter labels it (Hostname became hostname in 4.8.3: both are printed, one is empty).
WHICH = ("GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on node {{ $labels.Hostname }}{{ $labels.hostname }}"
         " (pod {{ $labels.namespace }}/{{ $labels.pod }})")
WINDOW = "10m"


def xid_error() -> Alert:
    return Alert(
        alert="InfersightGpuXidError", severity="critical",
        expr=f"{XID_ERRORS.name} != 0",
        summary="XID {{ $value }} on GPU {{ $labels.gpu }} of {{ $labels.Hostname }}{{ $labels.hostname }}",
        description=(f"{WHICH} reported XID error {{{{ $value }}}} (dcgm-exporter's last XID code). Codes 48, 63, 64, "
                     f"74, 79, 92, 94 and 95 are hardware or driver faults that usually need the GPU reset or the "
                     f"node drained; 13, 31 and 43 are usually the application's own fault."),
        runbook=R.runbook((R.GPU_CLOCKS_PANEL, R.GPU_POWER_PANEL),
                          f"read {R.SUMMARY} on the agent of that pod (\"gpu\": status and phases) and "
                          f"{R.SLOWEST} for requests failed around it; look the code up in NVIDIA's XID catalogue",
                          "Cordon the node if the code is a hardware one; the alert clears when the driver reloads."))


def throttling(series: DcgmSeries, kind: str, panel: R.Panel, config: RulesConfig) -> Alert:
    share = f"{config.gpu_throttle_share:g}"
    return Alert(
        alert=f"InfersightGpu{kind.title()}Throttling", severity="warning", for_="10m",
        expr=f"rate({series.name}[{WINDOW}]) * {series.to_base:g} > {share}",
        summary=(f"GPU {{{{ $labels.gpu }}}} of {{{{ $labels.Hostname }}}}{{{{ $labels.hostname }}}} {kind}-throttled "
                 f"{{{{ $value | humanizePercentage }}}} of the time"),
        description=(f"{WHICH} spent {{{{ $value | humanizePercentage }}}} of the last {WINDOW} with its clocks held "
                     f"down by {kind} limits, for 10 minutes (alert above {100 * config.gpu_throttle_share:g}%). "
                     f"Steps run slower meanwhile: step time and ITL rise with no change in load."),
        runbook=R.runbook((panel, R.GPU_CLOCKS_PANEL, R.ITL_PANEL),
                          f"read {R.SUMMARY} on the agent of that pod (\"gpu\") and compare the Step duration panel",
                          "Thermal: check the node's cooling and fan state. Power: check the power limit "
                          "(nvidia-smi -q -d POWER) against the board's default."))


def gpu_alerts(config: RulesConfig) -> list[Alert]:
    return [xid_error(),
            throttling(THERMAL_VIOLATION, "thermal", R.GPU_TEMPERATURE_PANEL, config),
            throttling(POWER_VIOLATION, "power", R.GPU_POWER_PANEL, config)]
