"""correlate.energy on hand-built counters and steps: interpolation against exact fractions,
disjoint windows, conservation in integers, and the SM-active integral."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd

from infersight.correlate.energy import counter_at, disjoint_windows, integrate_gauge, step_values

#: Two GPUs read at the sampler's times (ns), cumulative uJ. GPU 1 has a glitch (a reading lower
#: than the one before it), which the running maximum smooths out.
COUNTER = pd.DataFrame({"ts_ns": [1000, 2000, 3000, 1000, 2000, 3000],
                        "gpu": [0, 0, 0, 1, 1, 1],
                        "value": [5_000_000, 5_010_001, 5_030_007, 900, 2_337, 2_000]})
STEPS = pd.DataFrame({"step_id": [7, 8, 9], "start_ns": [1137, 1901, 2500], "end_ns": [1850, 2413, 2999]})


def naive_counter(t: int) -> int:
    """The same interpolation by hand, in exact fractions, GPU by GPU (GPU 1's 2000 reads as 2337)."""
    total = Fraction(0)
    for readings in ([(1000, 5_000_000), (2000, 5_010_001), (3000, 5_030_007)],
                     [(1000, 900), (2000, 2_337), (3000, 2_337)]):
        for (t0, v0), (t1, v1) in zip(readings, readings[1:]):
            if t0 <= t <= t1:
                total += v0 + Fraction(v1 - v0) * (t - t0) / (t1 - t0)
                break
    return round(total)


def test_counter_at_matches_exact_fractions() -> None:
    at = np.array([1000, 1137, 1850, 1901, 2000, 2413, 2500, 2999, 3000])
    assert counter_at(COUNTER, at).tolist() == [naive_counter(int(t)) for t in at]
    # Outside the readings the nearest one holds.
    assert counter_at(COUNTER, np.array([0, 5000])).tolist() == [5_000_900, 5_032_344]
    assert counter_at(COUNTER.iloc[:0], np.array([1, 2])).tolist() == [0, 0]


def test_step_values_are_window_differences_and_conserve_the_delta() -> None:
    per_step, idle = step_values(STEPS, COUNTER, 1000, 3000)
    assert per_step["step_id"].tolist() == [7, 8, 9]
    expected = [naive_counter(e) - naive_counter(s) for s, e in ((1137, 1850), (1901, 2413), (2500, 2999))]
    assert per_step["value"].tolist() == expected
    gaps = [(1000, 1137), (1850, 1901), (2413, 2500), (2999, 3000)]
    assert idle == sum(naive_counter(b) - naive_counter(a) for a, b in gaps)
    assert int(per_step["value"].sum()) + idle == naive_counter(3000) - naive_counter(1000)  # exact


def test_overlapping_steps_are_made_disjoint() -> None:
    steps = pd.DataFrame({"step_id": [2, 1, 3, 4], "start_ns": [150, 100, 180, 500], "end_ns": [300, 200, 250, 900]})
    w = disjoint_windows(steps, 120, 800)
    # Ordered by start; 1 clipped to from_ns; 2 starts where 1 ended; 3 lies inside 2 (zero length);
    # 4 clipped to to_ns.
    assert w.values.tolist() == [[1, 120, 200], [2, 200, 300], [3, 300, 300], [4, 500, 800]]
    per_step, idle = step_values(steps, COUNTER, 120, 800)
    assert int(per_step["value"].sum()) + idle == 0  # before the first reading the counter is flat


def test_integrate_gauge_accumulates_window_averages() -> None:
    samples = pd.DataFrame({"ts_ns": [100, 300, 700, 100, 400], "gpu": [0, 0, 0, 1, 1],
                            "value": [0.9, 0.5, 0.25, 1.0, 0.3]})
    c = integrate_gauge(samples)
    # GPU 0: 0 at its first reading, + 0.5 * 200, + 0.25 * 400; GPU 1: 0, + 0.3 * 300.
    assert c.values.tolist() == [[100, 0, 0], [300, 0, 100], [700, 0, 200], [100, 1, 0], [400, 1, 90]]
    more = pd.DataFrame({"ts_ns": [700, 900], "gpu": [0, 0], "value": [0.25, 1.0]})
    # Continuing from the last row: the 700 reading was taken in already, 900 adds 1.0 * 200.
    assert integrate_gauge(more, origin={0: (700, 200)}).values.tolist() == [[900, 0, 400]]
