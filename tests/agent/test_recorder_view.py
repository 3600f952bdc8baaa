"""What the flight recorder shows (agent.recorder.view), on a hand-built window summary: the counters a
window adds, the roof fractions it leaves (NaN ones not), the gauges and the summary block. Expected
values are the hand-built rows' own sums."""
from __future__ import annotations

import math

import pandas as pd

from infersight.agent.recorder.budget import WindowBudget
from infersight.agent.recorder.store import WindowStore
from infersight.agent.recorder.view import fold_window, gauge_rows, summary_block, zero_recorder_series
from infersight.correlate.kernel_windows import WindowSummary
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter
from infersight.kernels.analysis.roofline import DeviceCeilings


def summary() -> WindowSummary:
    time = pd.DataFrame({"phase": ["decode", "decode", "prefill"], "op_category": ["gemm", "attention", "gemm"],
                         "time_ns": [3_000, 1_000, 4_000], "activities": [5, 2, 7]})
    phases = pd.DataFrame({"phase": ["decode", "prefill"], "steps": [3, 1], "window_ns": [9_000, 5_000],
                           "idle_ns": [500, 0]})
    roofline = pd.DataFrame({"op_category": ["gemm", "attention"], "flops": [1e9, 2e6], "bytes": [1e6, 4e6],
                             "kernel_ns": [7_000, 1_000], "pct_of_roof": [0.25, math.nan]})
    return WindowSummary(time, phases, roofline, steps=4, activities=14, time_ns=8_000, device_kind="gpu")


def counters() -> dict[str, LabelledCounter]:
    return {spec.name: LabelledCounter() for spec in C.CATALOGUE if spec.kind == "counter"}


def test_a_window_adds_its_rows_to_the_kernel_counters_and_leaves_known_roof_fractions() -> None:
    got = counters()
    assert fold_window(got, summary()) == {"gemm": 0.25}  # attention's NaN keeps the last known value
    assert got[C.KERNEL_TIME.name].values == {("gemm", "decode"): 3e-6, ("attention", "decode"): 1e-6,
                                              ("gemm", "prefill"): 4e-6}
    assert got[C.KERNEL_ACTIVITIES.name].values == {("decode",): 7.0, ("prefill",): 7.0}
    assert got[C.KERNEL_SAMPLED_STEPS.name].values == {("decode",): 3.0, ("prefill",): 1.0}
    assert got[C.KERNEL_STEP_WINDOW.name].values == {("decode",): 9e-6, ("prefill",): 5e-6}
    assert got[C.KERNEL_IDLE.name].values == {("decode",): 5e-7, ("prefill",): 0.0}
    assert got[C.KERNEL_FLOPS.name].values == {("gemm",): 1e9, ("attention",): 2e6}
    assert got[C.KERNEL_BYTES.name].values == {("gemm",): 1e6, ("attention",): 4e6}
    assert got[C.KERNEL_ROOF_TIME.name].values == {("gemm",): 7e-6, ("attention",): 1e-6}


def test_every_recorder_series_starts_at_zero() -> None:
    got = counters()
    zero_recorder_series(got)
    assert set(got[C.RECORDER_TRIGGERED.name].values) == {(r,) for r in C.RECORDER_REASONS}
    assert set(got[C.RECORDER_WINDOWS.name].values) == {(o,) for o in C.RECORDER_OUTCOMES}
    assert set(got[C.RECORDER_COST.name].values) == {("window",), ("triggered",)}
    assert got[C.RECORDER_ENGINE.name].values == {(): 0.0}
    assert sum(c.total() for c in got.values()) == 0.0


def test_gauges_show_the_ceilings_only_once_a_window_was_measured_against_them() -> None:
    budget = WindowBudget(0.01, 0.02)  # interval: 0.02 / 0.01 = 2 engine seconds
    plain = gauge_rows(budget, {"gemm": 0.25}, None)
    assert [(spec.name, rows) for spec, rows in plain] == [
        (C.RECORDER_BUDGET.name, [([], 0.01)]), (C.RECORDER_COST_RATIO.name, [([], 0.0)]),
        (C.RECORDER_INTERVAL.name, [([], 2.0)]), (C.KERNEL_ROOF_FRACTION.name, [(["gemm"], 0.25)])]
    peaks = gauge_rows(budget, {}, DeviceCeilings("cpu", 2.0, 30.0))[-2:]  # numbers given by hand: "given"
    assert [(spec.name, rows) for spec, rows in peaks] == [(C.KERNEL_PEAK_FLOPS.name, [(["cpu", "given"], 2e12)]),
                                                          (C.KERNEL_PEAK_BYTES.name, [(["cpu", "given"], 30e9)])]
    sheet = gauge_rows(budget, {}, DeviceCeilings())[-2:]  # the default: the H200's datasheet
    assert [rows[0][0] for _, rows in sheet] == [["NVIDIA H200", "datasheet"]] * 2


def test_the_summary_block_takes_medians_of_window_costs_and_the_last_analysed_windows_shares() -> None:
    budget = WindowBudget(0.01, 0.02)
    store = WindowStore(keep=4)
    store.add({"kind": "window", "summary": {"time": summary().as_dict()["time"]}})
    store.add({"kind": "window", "error": "no trace"})  # the newest has no summary: the one before shows
    costs = [{"kind": "window", "cost_s": 0.1, "noise_s": 0.01}, {"kind": "triggered", "cost_s": 9.0, "noise_s": 9.0},
             {"kind": "window", "cost_s": 0.3, "noise_s": 0.03}, {"kind": "window", "cost_s": 0.2, "noise_s": 0.05}]
    block = summary_block(budget, costs, store, [{"reason": "slo_breach"}])
    assert (block["windows_measured"], block["window_cost_median_s"], block["window_noise_median_s"]) == (3, 0.2, 0.03)
    assert block["last_window_category_shares"] == {"gemm": 7_000 / 8_000, "attention": 1_000 / 8_000}
    assert block["triggered_captures"] == [{"reason": "slo_breach"}]
    assert block["store"]["windows"] == 2
    empty = summary_block(budget, [], WindowStore(keep=1), [])
    assert (empty["windows_measured"], empty["window_cost_median_s"], empty["last_window_category_shares"]) == \
        (0, None, {})
