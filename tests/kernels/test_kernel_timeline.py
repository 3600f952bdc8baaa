"""Busy / idle arithmetic on a hand-built timeline, and the findings it leads to."""
from __future__ import annotations

import pandas as pd

from infersight.kernels.analysis.categories import classify
from infersight.kernels.analysis.findings import launch_findings
from infersight.kernels.analysis.timeline import idle_gaps, phase_breakdown, top_kernels

BASE = 1_700_000_000_000_000_000  # epoch-scale ns: must stay exact (not float64)


def _frame() -> pd.DataFrame:
    rows = [  # ts, dur, stream, step, path
        (0, 10, 7, 0, "step/forward.decode"), (30, 10, 7, 0, "step/forward.decode"),   # gap 20
        (35, 10, 8, 0, "step/forward.decode"),                                          # overlaps on stream 8
        (60, 20, 7, 0, "step/sampling"),
        (1000, 10, 7, 1, "step/forward.decode"), (1050, 10, 7, 1, "step/forward.decode"),  # gap 40
        (500_000, 5, 7, -1, ""), (500_010, 5, 7, -1, ""),                                # outside steps: gap 5
        (900_000, 5, 7, -1, ""),                                                         # after a long pause
    ]
    return pd.DataFrame({"ts_ns": [BASE + r[0] for r in rows], "dur_ns": [r[1] for r in rows],
                         "stream": [r[2] for r in rows], "step_id": [r[3] for r in rows],
                         "range_path": [r[4] for r in rows], "device": 0, "category": "kernel",
                         "name": [f"k{i % 3}" for i in range(len(rows))]})


def test_idle_gaps_per_stream_and_device() -> None:
    gaps = idle_gaps(_frame()).set_index(["device", "stream"])
    dev = gaps.loc[(0, -1)]
    # Union on the device: [0,10) [30,45) [60,80) [1000,1010) [1050,1060) + 3 x 5 = 10+15+20+10+10+15 = 80.
    assert dev["busy_ns"] == 80 and dev["span_ns"] == 900_005 and dev["idle_ns"] == 900_005 - 80
    assert dev["gaps"] == 7 and dev["max_gap_ns"] == 500_000 - 1060
    # Short idle (< 100 us): 20 + 15 + 920 + 40 + 5 = 1000.
    assert dev["short_idle_ns"] == 20 + 15 + 920 + 40 + 5
    s8 = gaps.loc[(0, 8)]
    assert s8["activities"] == 1 and s8["busy_ns"] == 10 and s8["idle_ns"] == 0


def test_phase_windows_and_launch_bound_finding() -> None:
    classified = classify(_frame())
    phases = phase_breakdown(classified).set_index("phase")
    decode = phases.loc["decode"]
    # Step 0 window [0, 45): busy 25 (10 + union of [30,40) and [35,45)); step 1 [1000, 1060): busy 20.
    assert decode["steps"] == 2 and decode["window_ns"] == 45 + 60 and decode["busy_ns"] == 25 + 20
    assert decode["kernel_ns"] == 50 and decode["idle_ns"] == 105 - 45
    # Outside steps the 400 us pause splits the runs: windows [500000, 500015) and [900000, 900005).
    none = phases.loc["(none)"]
    assert none["window_ns"] == 15 + 5 and none["busy_ns"] == 15 and none["steps"] == 0
    found = launch_findings(phase_breakdown(classified), has_timeline=True)
    assert [f.severity for f in found if f.text.startswith("decode is launch-bound")] == ["high"]
    assert launch_findings(phase_breakdown(classified), has_timeline=False) == []


def test_top_kernels() -> None:
    top = top_kernels(classify(_frame()), n=2)
    # k0: 10 + 20 + 5, k1 and k2: 25 each (a tie goes to the name that sorts first).
    assert list(top["name"]) == ["k0", "k1"] and top["total_ns"].tolist() == [35, 25]
    assert top["share"].sum() < 1
