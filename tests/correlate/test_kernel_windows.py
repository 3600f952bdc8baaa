"""correlate.kernel_windows on an eight-row classified frame: exact time by (phase, category), step
windows with their idle time, call counts by correlation, and the roofline rows kept."""
from __future__ import annotations

import pandas as pd

from infersight.correlate.kernel_windows import WINDOW_PHASES, bounded_phase, summarize_window

# (ts_ns, dur_ns, correlation, step_id, phase, op_category); one device, one stream. Correlation 3 is
# one call in two segments (a CPU op whose child ran in between), so it counts once.
ROWS = [
    (0, 10, 1, 0, "decode", "GEMM"),
    (15, 5, 2, 0, "decode", "attention-decode"),
    (30, 4, 3, 0, "decode", "GEMM"),
    (36, 6, 3, 0, "decode", "GEMM"),
    (100, 20, 4, 1, "decode", "GEMM"),
    (130, 10, 5, 1, "sampling", "sampling"),
    (500, 7, 6, -1, "(none)", "memcpy"),
    (600, 3, 7, 1, "a-phase-of-its-own", "other"),
]


def classified() -> pd.DataFrame:
    f = pd.DataFrame(ROWS, columns=["ts_ns", "dur_ns", "correlation", "step_id", "phase", "op_category"])
    return f.assign(device=0, stream=7)


def test_time_by_phase_and_category_counts_calls_not_segments() -> None:
    s = summarize_window(classified(), pd.DataFrame(), "cpu")
    got = [tuple(r) for r in s.time[["phase", "op_category", "activities", "time_ns"]].itertuples(index=False)]
    assert got == [("decode", "GEMM", 3, 10 + 4 + 6 + 20), ("decode", "attention-decode", 1, 5),
                   ("none", "memcpy", 1, 7), ("other", "other", 1, 3), ("sampling", "sampling", 1, 10)]
    assert (s.steps, s.activities, s.time_ns, s.device_kind) == (2, 7, 65, "cpu")


def test_step_windows_measure_idle_between_activities_inside_steps_only() -> None:
    s = summarize_window(classified(), pd.DataFrame(), "gpu")
    got = {r.phase: (r.steps, r.activities, r.window_ns, r.busy_ns, r.idle_ns) for r in s.phases.itertuples()}
    # decode: step 0 spans 0..42 with 25 busy; step 1 spans 100..120, all busy. The memcpy outside
    # every step is not in any window; the lone "other" activity is a window of its own with no gap.
    assert got == {"decode": (2, 4, 42 + 20, 25 + 20, 17), "sampling": (1, 1, 10, 10, 0), "other": (1, 1, 3, 3, 0)}


def test_roofline_rows_without_time_are_dropped_and_input_is_not_changed() -> None:
    frame = classified()
    before = frame.copy()
    roof = pd.DataFrame({"op_category": ["GEMM", "MoE routing"], "flops": [4e6, 1e3], "bytes": [2e6, 10.0],
                         "kernel_ns": [40, 0], "achieved_tflops": [0.1, 0.0], "achieved_gbps": [50.0, 0.0],
                         "pct_of_roof": [0.5, 0.0], "bound": ["memory", "memory"]})
    s = summarize_window(frame, roof, "gpu")
    assert s.roofline.to_dict("records") == [{"op_category": "GEMM", "flops": 4e6, "bytes": 2e6, "kernel_ns": 40,
                                              "achieved_tflops": 0.1, "achieved_gbps": 50.0, "pct_of_roof": 0.5}]
    pd.testing.assert_frame_equal(frame, before)
    assert s.as_dict()["time"][0] == {"phase": "decode", "op_category": "GEMM", "activities": 3, "time_ns": 40}


def test_phase_labels_are_bounded() -> None:
    assert bounded_phase("(none)") == bounded_phase("") == "none"
    assert [bounded_phase(p) for p in ("decode", "verify", "kv.swap_in", "layer.3")] == \
        ["decode", "verify", "kv.swap_in", "other"]
    assert set(map(bounded_phase, ["x", "prefill", "(none)"])) <= set(WINDOW_PHASES)


def test_an_empty_window_gives_empty_typed_frames() -> None:
    s = summarize_window(classified().iloc[0:0], pd.DataFrame(), "gpu")
    assert s.time.empty and s.phases.empty and s.roofline.empty and (s.steps, s.activities, s.time_ns) == (0, 0, 0)
    assert list(s.time.columns) == ["phase", "op_category", "activities", "time_ns"]
