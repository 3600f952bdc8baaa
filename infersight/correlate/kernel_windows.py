"""One sampled capture window -> the few numbers the flight recorder folds into time series.

Pure functions over the frames of `infersight.kernels` (never mutated): `classified` is
`kernels.analysis.categories.classify(trace.kernels)` (one row per GPU activity, or per CPU-op segment on a
CPU trace: ts_ns, dur_ns, device, stream, correlation, step_id, phase, op_category, ...), and
`roofline` is `kernels.analysis.roofline.place_on_roofline` output (op_category, flops, bytes, kernel_ns,
achieved_tflops, achieved_gbps, pct_of_roof, ...; empty when the window's shapes are unknown).

Frames returned (`summarize_window`):

time      phase, op_category, activities, time_ns — activity time of the window by (phase,
          category); phase is bounded to WINDOW_PHASES ("other" for anything else, "none"
          outside every range). activities counts calls: distinct correlations (on a CPU trace
          the segments of one op call share one).
phases    phase, steps, activities, window_ns, busy_ns, idle_ns — per phase, the distinct steps
          seen, calls, and the summed step windows (first to last activity of each step, per
          device) with their busy union and idle rest: idle / window is the launch-gap share
          (on a CPU trace: time between ops).
roofline  op_category, flops, bytes, kernel_ns, achieved_tflops, achieved_gbps, pct_of_roof —
          the input's rows, those columns only, kernel_ns > 0.

Scalars (`WindowSummary`): steps (distinct step ids), activities, time_ns, device_kind (gpu | cpu).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from infersight.kernels.analysis.paths import NO_PHASE
from infersight.kernels.analysis.timeline import phase_breakdown

#: Phase label values (bounded): the engine's forwards and the ranges beside them under "step".
WINDOW_PHASES = ("prefill", "decode", "mixed", "verify", "draft", "sampling", "schedule", "step", "kv.swap_in",
                 "kv.swap_out", "none", "other")
TIME_COLUMNS = {"phase": "object", "op_category": "object", "activities": "int64", "time_ns": "int64"}
PHASE_COLUMNS = {"phase": "object", "steps": "int64", "activities": "int64", "window_ns": "int64",
                 "busy_ns": "int64", "idle_ns": "int64"}
ROOF_COLUMNS = {"op_category": "object", "flops": "float64", "bytes": "float64", "kernel_ns": "int64",
                "achieved_tflops": "float64", "achieved_gbps": "float64", "pct_of_roof": "float64"}


def bounded_phase(phase: str) -> str:
    """A phase as a label value: one of WINDOW_PHASES."""
    if phase == NO_PHASE or phase == "":
        return "none"
    return phase if phase in WINDOW_PHASES else "other"


@dataclass(frozen=True)
class WindowSummary:
    """A window's time by (phase, category), its per-phase step windows, its roofline rows."""

    time: pd.DataFrame
    phases: pd.DataFrame
    roofline: pd.DataFrame
    steps: int
    activities: int
    time_ns: int
    device_kind: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-able (the recorder's in-memory and on-disk form)."""
        def rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
            return [{k: (v.item() if isinstance(v, np.generic) else v) for k, v in r.items()}
                    for r in frame.to_dict(orient="records")]
        return {"steps": self.steps, "activities": self.activities, "time_ns": self.time_ns,
                "device_kind": self.device_kind, "time": rows(self.time), "phases": rows(self.phases),
                "roofline": rows(self.roofline)}


def _typed(frame: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    if frame.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})
    return frame[list(columns)].astype(columns).reset_index(drop=True)


def time_by_phase_category(classified: pd.DataFrame) -> pd.DataFrame:
    """The `time` frame (module docstring), sorted by phase then category."""
    if classified.empty:
        return _typed(classified, TIME_COLUMNS)
    d = classified.assign(phase=classified["phase"].map(bounded_phase))
    g = d.groupby(["phase", "op_category"], sort=True).agg(activities=("correlation", "nunique"),
                                                           time_ns=("dur_ns", "sum")).reset_index()
    return _typed(g, TIME_COLUMNS)


def step_windows_by_phase(classified: pd.DataFrame) -> pd.DataFrame:
    """The `phases` frame: kernels.analysis.timeline.phase_breakdown over the steps only (activity outside
    every step says nothing about launch gaps), its phases bounded and calls counted as correlations."""
    in_steps = classified[classified["step_id"] >= 0]
    if in_steps.empty:
        return _typed(in_steps, PHASE_COLUMNS)
    d = in_steps.assign(phase=in_steps["phase"].map(bounded_phase))
    per = phase_breakdown(d)
    calls = d.groupby("phase")["correlation"].nunique()
    per = per.assign(activities=per["phase"].map(calls).fillna(0).astype(np.int64))
    return _typed(per.sort_values("phase", kind="stable"), PHASE_COLUMNS)


def summarize_window(classified: pd.DataFrame, roofline: pd.DataFrame, device_kind: str) -> WindowSummary:
    """The window's summary (module docstring). device_kind: gpu | cpu, what the activities are."""
    roof = roofline[roofline["kernel_ns"] > 0] if not roofline.empty else roofline
    steps = int(classified.loc[classified["step_id"] >= 0, "step_id"].nunique()) if not classified.empty else 0
    return WindowSummary(time=time_by_phase_category(classified), phases=step_windows_by_phase(classified),
                         roofline=_typed(roof, ROOF_COLUMNS), steps=steps,
                         activities=int(classified["correlation"].nunique()) if not classified.empty else 0,
                         time_ns=int(classified["dur_ns"].sum()) if not classified.empty else 0,
                         device_kind=device_kind)
