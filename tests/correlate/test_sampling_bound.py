"""correlate.sampling_bound against the worst case found by linear programming: for a request's
share g(t) over a reading interval, scipy's linprog picks the power profile within [lo, hi] with
the interval's measured rise that makes interpolation err the most. The bound must never be below
it, and must meet it where g takes two values only."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linprog

from infersight.correlate.sampling_bound import interval_bounds, interval_shares

DT = 1_000_000_000  # one reading interval of 1 s, in ns
RISE = 400_000  # uJ over it: 400 W on average (1 W = 1e-3 uJ per ns)
HI = 700e-3  # the GPU's power at most 700 W, at least 0


def worst_error(segments: list[tuple[int, float]], lo: float = 0.0, hi: float = HI) -> float:
    """max |integral of g (P - mean)| over P in [lo, hi] with integral P = RISE; segments: (length ns,
    g) covering the interval, g constant on each (so only each segment's mean power matters)."""
    length = np.array([s[0] for s in segments], np.float64)
    g = np.array([s[1] for s in segments])
    mean = RISE / DT
    worst = 0.0
    for sign in (1, -1):
        res = linprog(-sign * g * length, A_eq=[length], b_eq=[RISE], bounds=[(lo, hi)] * len(segments))
        assert res.success
        worst = max(worst, sign * float(g * length @ res.x) - sign * mean * float(g @ length))
    return worst


def bound_of(windows: list[tuple[int, int, float]], hi: float = HI) -> float:
    """The module's bound for request 1 with these (start, end, share) windows in [0, DT]."""
    w = pd.DataFrame([(1, a, b, s) for a, b, s in windows], columns=["request_id", "start_ns", "end_ns", "share"])
    readings = pd.DataFrame({"ts_ns": [0, DT], "gpu": [0, 0], "value": [5_000_000, 5_000_000 + RISE]})
    shares = interval_shares(w, readings)
    assert len(shares) == 1 and shares["dt_ns"].iloc[0] == DT and shares["rise"].iloc[0] == RISE
    return float(interval_bounds(shares, 0.0, hi)[0])


def segments_of(windows: list[tuple[int, int, float]]) -> list[tuple[int, float]]:
    """The interval cut at every window edge, with g on each piece (0 outside the windows)."""
    cuts = sorted({0, DT, *(a for a, _, _ in windows), *(b for _, b, _ in windows)})
    return [(b - a, next((s for x, y, s in windows if x <= a and b <= y), 0.0)) for a, b in zip(cuts, cuts[1:])]


def test_a_request_alone_all_interval_long_has_no_sampling_error() -> None:
    assert bound_of([(0, DT, 1.0)]) == pytest.approx(0.0, abs=1e-6)
    assert bound_of([(0, DT // 2, 0.25), (DT // 2, DT, 0.25)]) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("windows", [
    [(0, DT // 2, 1.0)],                                     # the request's first half second: an edge
    [(DT // 4, DT, 0.5)],                                    # joins a step's batch a quarter in
    [(0, 3 * DT // 10, 0.2), (3 * DT // 10, DT, 0.2)],      # constant share, two steps: no error
])
def test_two_level_shares_meet_the_linear_programs_worst_case(windows: list[tuple[int, int, float]]) -> None:
    assert bound_of(windows) == pytest.approx(worst_error(segments_of(windows)), rel=1e-9, abs=1e-3)


def test_the_bound_is_never_below_the_worst_case_for_random_shares() -> None:
    rng = np.random.default_rng(7)
    for _ in range(30):
        cuts = np.sort(rng.choice(np.arange(1, 100), size=rng.integers(2, 9), replace=False)) * (DT // 100)
        edges = [0, *cuts.tolist(), DT]
        windows = [(a, b, float(rng.choice([0.0, rng.random()]))) for a, b in zip(edges, edges[1:])]
        windows = [w for w in windows if w[2] > 0] or [(0, DT // 3, 0.5)]
        worst = worst_error(segments_of(windows))
        assert bound_of(windows) >= worst - 1e-3
        assert bound_of(windows) <= HI * DT  # and it says something: never more than the whole interval at HI


def test_windows_across_several_intervals_are_cut_at_each_reading() -> None:
    w = pd.DataFrame({"request_id": [1, 2], "start_ns": [500, 100], "end_ns": [2500, 300], "share": [0.5, 1.0]})
    readings = pd.DataFrame({"ts_ns": [0, 1000, 2000, 3000], "gpu": 0, "value": [0, 10, 30, 30]})
    shares = interval_shares(w, readings).sort_values(["request_id", "t0_ns"])
    assert shares[["request_id", "t0_ns", "dt_ns", "rise", "length_ns", "covered_ns"]].values.tolist() == [
        [1, 0, 1000, 10, 250.0, 500.0], [1, 1000, 1000, 20, 500.0, 1000.0], [1, 2000, 1000, 0, 250.0, 500.0],
        [2, 0, 1000, 10, 200.0, 200.0]]
