"""What the flight recorder shows (agent.recorder.flight_recorder keeps the state, this turns it into output):
a window's summary folded into the KERNEL_METRICS counters, the recorder's gauges (exporters.recorder
renders them) and its summary block (report.summary shows it as "flight_recorder").

Pure functions of what they are given; the caller holds the agent state's lock around the counters.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from infersight.agent.recorder.budget import WindowBudget
from infersight.agent.recorder.store import WindowStore
from infersight.correlate.kernel_windows import WindowSummary
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter
from infersight.kernels.ceilings.device_ceilings import CeilingSource, DeviceCeilings

#: (spec, [(label values, value)]) per gauge, as exporters.recorder reads them.
GaugeRows = list[tuple[C.MetricSpec, list[tuple[list[str], float]]]]


def zero_recorder_series(counters: dict[str, LabelledCounter]) -> None:
    """Every recorder series at 0 from the start, so that the first increase shows in rate()."""
    for reason in C.RECORDER_REASONS:
        counters[C.RECORDER_TRIGGERED.name].inc((reason,), 0)
    for outcome in C.RECORDER_OUTCOMES:
        counters[C.RECORDER_WINDOWS.name].inc((outcome,), 0)
    for kind in ("window", "triggered"):
        counters[C.RECORDER_COST.name].inc((kind,), 0)
    counters[C.RECORDER_ENGINE.name].inc((), 0)


def fold_window(counters: dict[str, LabelledCounter], s: WindowSummary) -> dict[str, float]:
    """A window's summary into the KERNEL_METRICS counters; returns its fraction of the roof per op
    category (the categories whose fraction is known: NaN ones are left out, so that the gauge keeps
    the last known value)."""
    for r in s.time.itertuples(index=False):
        counters[C.KERNEL_TIME.name].inc((r.op_category, r.phase), r.time_ns / 1e9)
    for phase, n in s.time.groupby("phase")["activities"].sum().items():
        counters[C.KERNEL_ACTIVITIES.name].inc((str(phase),), int(n))
    for r in s.phases.itertuples(index=False):
        counters[C.KERNEL_SAMPLED_STEPS.name].inc((r.phase,), r.steps)
        counters[C.KERNEL_STEP_WINDOW.name].inc((r.phase,), r.window_ns / 1e9)
        counters[C.KERNEL_IDLE.name].inc((r.phase,), r.idle_ns / 1e9)
    roof_fraction: dict[str, float] = {}
    for r in s.roofline.itertuples(index=False):
        counters[C.KERNEL_FLOPS.name].inc((r.op_category,), r.flops)
        counters[C.KERNEL_BYTES.name].inc((r.op_category,), r.bytes)
        counters[C.KERNEL_ROOF_TIME.name].inc((r.op_category,), r.kernel_ns / 1e9)
        if r.pct_of_roof == r.pct_of_roof:  # not NaN
            roof_fraction[r.op_category] = float(r.pct_of_roof)
    return roof_fraction


def gauge_rows(budget: WindowBudget, roof_fraction: dict[str, float],
               ceilings_used: DeviceCeilings | None) -> GaugeRows:
    """The recorder's gauges: its budget, cost ratio and window interval, the roof fractions and, once a
    window was placed against known ceilings, their peaks, labelled with each one's source (measured,
    datasheet or given: kernels.ceilings.device_ceilings)."""
    rows: GaugeRows = [
        (C.RECORDER_BUDGET, [([], budget.budget)]),
        (C.RECORDER_COST_RATIO, [([], budget.cost_ratio)]),
        (C.RECORDER_INTERVAL, [([], budget.interval_s)]),
        (C.KERNEL_ROOF_FRACTION, [([k], v) for k, v in sorted(dict(roof_fraction).items())])]
    if ceilings_used is not None:
        c = ceilings_used
        rows += [(C.KERNEL_PEAK_FLOPS, [([c.name, _kind(c.tflops_source)], c.peak_tflops * 1e12)]),
                 (C.KERNEL_PEAK_BYTES, [([c.name, _kind(c.gbps_source)], c.peak_gbps * 1e9)])]
    return rows


def _kind(source: CeilingSource | None) -> str:
    return source.kind if source is not None else "given"


def summary_block(budget: WindowBudget, costs: Iterable[dict[str, Any]], store: WindowStore,
                  triggers: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The recorder's summary block: its budget, the measured window costs (medians), the op-category
    shares of the last analysed window, the triggered captures and the store's stats."""
    costs = list(costs)
    window_costs = [c["cost_s"] for c in costs if c["kind"] == "window"]
    noise = [c["noise_s"] for c in costs if c["kind"] == "window"]
    last = next((w for w in reversed(store.recent()) if "summary" in w), None)
    shares: dict[str, float] = {}
    if last is not None:
        total = sum(r["time_ns"] for r in last["summary"]["time"]) or 1
        for r in last["summary"]["time"]:
            shares[r["op_category"]] = shares.get(r["op_category"], 0.0) + r["time_ns"] / total
    return {"budget": budget.budget, "cost_ratio": budget.cost_ratio,
            "engine_seconds": budget.engine_s, "cost_seconds": budget.cost_s,
            "triggered_cost_seconds": budget.triggered_cost_s,
            "window_cost_estimate_s": budget.estimate_s, "window_reservation_s": budget.reserve_s,
            # Where the reservation came from before this run measured a window: the guess
            # (--recorder-initial-cost, modelled) or the costs kept windows measured (measured).
            "reservation_from": ("this run's windows (measured)" if budget.measured else
                                 f"{budget.seeded} kept windows' costs (measured)" if budget.seeded else
                                 f"the initial guess {budget.initial_cost_s:g} s (modelled)"),
            "window_interval_engine_s": budget.interval_s,
            "windows_measured": len(window_costs),
            "window_cost_median_s": float(np.median(window_costs)) if window_costs else None,
            "window_noise_median_s": float(np.median(noise)) if noise else None,
            "last_window_category_shares": shares, "triggered_captures": list(triggers),
            "store": store.stats()}
