"""correlate.token_cost: the energy fit (static power and joules per token) against scipy's NNLS on
the raw rows, intervals' rows by hand, members' kinds from step totals and chunk events, the weights
and each step's dynamic share by hand."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import nnls

from infersight.correlate.token_cost import (
    MIN_INTERVALS_PER_KIND, REGRESSORS, WEIGHT_BITS, TokenCosts, fit_token_costs, interval_rows, member_tokens,
    member_weights, normal_equations, step_dynamic_share,
)


def _steps(rows: list[tuple[int, int, int, int, int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["step_id", "start_ns", "end_ns", "batch_size", "prefill_tokens",
                                       "decode_tokens", "spec_tokens"])


def _random_rows(seed: int, coefs: tuple[float, float, float], static_w: float = 0.0, n: int = 200) -> pd.DataFrame:
    """Intervals whose energy is the model's plus noise: busy seconds are the tokens' time on a
    made-up GPU plus host time that varies on its own (what lets static power be told apart)."""
    rng = np.random.default_rng(seed)
    p = rng.integers(0, 3000, n) * (rng.random(n) < 0.6)
    d = rng.integers(1, 400, n)
    s = rng.integers(0, 4, n) * d * (rng.random(n) < 0.5)
    busy = 2e-5 * p + 1e-3 * d + rng.uniform(0.05, 0.5, n)
    e = static_w * 1e6 * busy + coefs[0] * p + coefs[1] * d + coefs[2] * s + rng.normal(0, 2e4, n)
    return pd.DataFrame({"end_ns": np.arange(n), "energy_uj": e, "busy_s": busy, "prefill_tokens": p.astype(float),
                         "decode_tokens": d.astype(float), "spec_tokens": s.astype(float)})


@pytest.mark.parametrize("coefs,static_w", [((2e3, 4e4, 1e4), 0.0), ((2e3, -1e4, 3e4), 0.0),
                                            ((2e3, 4e4, 1e4), 100.0), ((2e3, 4e4, 1e4), -30.0)])
def test_fit_matches_scipy_nnls_on_the_raw_rows(coefs: tuple[float, float, float], static_w: float) -> None:
    rows = _random_rows(1, coefs, static_w)
    # Summed over two halves, as polls would: the same fit as over the whole.
    a, b = normal_equations(rows.iloc[:77]), normal_equations(rows.iloc[77:])
    fit = fit_token_costs(a[0] + b[0], a[1] + b[1], a[2] + b[2])
    x = rows[list(REGRESSORS)].to_numpy(np.float64)
    expected, _ = nnls(x, rows["energy_uj"].to_numpy(np.float64))
    assert [fit.static_w * 1e6, fit.prefill_uj, fit.decode_uj, fit.spec_uj] == pytest.approx(expected, rel=1e-6,
                                                                                            abs=1e-3)
    assert fit.usable and fit.intervals == len(rows)
    if coefs[1] < 0:  # a negative truth: the constraint binds and the coefficient is 0
        assert fit.decode_uj == 0.0
    if static_w < 0:
        assert fit.static_w == 0.0
    if static_w > 0:  # the noise is 2e4 uJ an interval: the truth comes back close
        assert fit.static_w == pytest.approx(static_w, rel=0.02)
        assert fit.decode_uj == pytest.approx(coefs[1], rel=0.02)


def test_fit_is_not_usable_on_too_few_intervals_or_kinds_it_cannot_tell_apart() -> None:
    # Three regressors seen (static, prefill, decode): six intervals are needed, five are not enough.
    few = _random_rows(2, (1e3, 1e4, 0), 50.0, n=3 * MIN_INTERVALS_PER_KIND).assign(spec_tokens=0.0)
    assert fit_token_costs(*normal_equations(few)).usable
    assert not fit_token_costs(*normal_equations(few.iloc[:-1])).usable
    # Every interval 10 prefill and 2 decode tokens per step: the kinds cannot be told apart.
    flat = pd.DataFrame({"end_ns": range(20), "energy_uj": np.arange(20.0) * 7, "busy_s": np.arange(20.0) * 0.1,
                         "prefill_tokens": np.arange(20.0) * 10, "decode_tokens": np.arange(20.0) * 2,
                         "spec_tokens": 0.0})
    assert not fit_token_costs(*normal_equations(flat)).usable
    assert fit_token_costs(*normal_equations(flat.iloc[:0])) == TokenCosts()


def test_interval_rows_sum_steps_by_the_reading_after_their_midpoint() -> None:
    measured = pd.DataFrame({"step_id": [1, 2, 3, 4], "start_ns": [0, 90, 140, 400], "end_ns": [80, 130, 260, 500],
                             "energy_uj": [5.0, 7.0, 11.0, 13.0], "prefill_tokens": [100, 0, 0, 3],
                             "decode_tokens": [0, 4, 4, 1], "spec_tokens": [0, 0, 8, 0]})
    # Steps 1 and 2 (midpoints 40, 110) lie before the reading at 120. Step 3's midpoint is the reading
    # at 200 itself: it counts in the interval after it. Step 4 lies past the last reading: keyed by it.
    rows = interval_rows(measured, np.array([0, 120, 200, 300]))
    got = rows.to_dict("list")
    assert got.pop("busy_s") == pytest.approx([(80 + 40) * 1e-9, (120 + 100) * 1e-9], rel=1e-12)  # step durations
    assert got == {"end_ns": [120, 300], "energy_uj": [12.0, 24.0], "prefill_tokens": [100.0, 3.0],
                   "decode_tokens": [4.0, 5.0], "spec_tokens": [0.0, 8.0]}
    assert interval_rows(measured, np.empty(0, np.int64)).empty


def test_member_kinds_from_step_totals_and_chunk_events() -> None:
    steps = _steps([(1, 100, 200, 2, 12, 0, 0),     # pure prefill: no chunk needed
                    (2, 200, 300, 3, 8, 2, 3),      # mixed with drafts: request 3's chunk starts at 200
                    (3, 300, 400, 2, 4, 1, 0),      # mixed, its chunk event lost: unresolved
                    (4, 400, 500, 2, 0, 2, 2)])     # pure decode with drafts
    batch = pd.DataFrame([(1, 1, 5), (1, 2, 7), (2, 1, 4), (2, 2, 1), (2, 3, 8), (3, 4, 4), (3, 1, 1),
                          (4, 1, 1), (4, 2, 3)], columns=["step_id", "request_id", "num_tokens"])
    chunks = pd.DataFrame({"request_id": [3, 1], "ts_ns": [200, 100]})  # request 1's is step 1's
    m = member_tokens(steps, batch, chunks)
    assert m[["prefill", "decode", "spec"]].values.tolist() == [
        [5, 0, 0], [7, 0, 0], [0, 1, 3], [0, 1, 0], [8, 0, 0], [0, 1, 3], [0, 1, 0], [0, 1, 0], [0, 1, 2]]
    # Step 3 reads request 4 as a decode of 1 + 3 drafts: its totals (4 prefill, 1 decode) disagree.
    assert m.groupby("step_id")["resolved"].first().tolist() == [True, True, False, True]
    # Without request 3's chunk, step 2 cannot be told apart either.
    assert member_tokens(steps, batch, chunks.iloc[1:]).groupby("step_id")["resolved"].first().tolist() == [
        True, False, False, True]


def test_weights_are_modelled_cost_shares_by_hand() -> None:
    members = pd.DataFrame({"step_id": [1, 1, 1, 2, 2], "request_id": [1, 2, 3, 1, 2], "num_tokens": [100, 1, 3, 1, 1],
                            "prefill": [100, 0, 0, 0, 0], "decode": [0, 1, 1, 1, 1], "spec": [0, 0, 2, 0, 0],
                            "resolved": [True, True, True, False, False]})
    costs = TokenCosts(prefill_uj=2e3, decode_uj=4e4, spec_uj=1e4, intervals=50, usable=True)
    cost = [Fraction(2_000 * 100), Fraction(40_000), Fraction(40_000 + 2 * 10_000)]
    expected = [round(c / sum(cost) * 2**WEIGHT_BITS) for c in cost] + [1, 1]  # step 2: unresolved, token share
    assert member_weights(members, costs).tolist() == expected
    # Joules per token all 0: token share.
    assert member_weights(members, TokenCosts(intervals=50, usable=True)).tolist() == [100, 1, 3, 1, 1]
    # An unusable fit: token share everywhere.
    assert member_weights(members, TokenCosts()).tolist() == [100, 1, 3, 1, 1]


def test_each_steps_dynamic_share_by_hand() -> None:
    steps = _steps([(1, 0, 2_000_000, 1, 100, 0, 0),          # 100 prefill tokens over 2 ms
                    (2, 2_000_000, 12_000_000, 3, 0, 3, 6),   # 3 decodes with 6 drafts over 10 ms
                    (3, 12_000_000, 12_000_000, 0, 0, 0, 0)])  # nothing, no time: no share
    costs = TokenCosts(prefill_uj=2e3, decode_uj=4e4, spec_uj=1e4, static_w=50.0, intervals=50, usable=True)
    # static: 50 W x 2 ms = 100,000 uJ; 50 W x 10 ms = 500,000 uJ.
    d1, d2 = Fraction(2_000 * 100), Fraction(3 * 40_000 + 6 * 10_000)
    expected = [float(d1 / (d1 + 100_000)), float(d2 / (d2 + 500_000))]
    share = step_dynamic_share(steps, costs)
    assert share[:2].tolist() == pytest.approx(expected, rel=1e-12) and np.isnan(share[2])
    # No static power: every step is all dynamic. A fit not usable: unknown.
    assert step_dynamic_share(steps.iloc[:2], TokenCosts(2e3, 4e4, 1e4, 0.0, 50, True)).tolist() == [1.0, 1.0]
    assert np.isnan(step_dynamic_share(steps, TokenCosts(2e3, 4e4, 1e4, 50.0, 3, False))).all()


def test_short_intervals_are_merged_until_long_enough_and_the_rest_waits() -> None:
    from infersight.correlate.token_cost import MIN_FIT_SPAN_NS, merge_short_intervals

    ms = 1_000_000
    # Ten 100-ms intervals from 0: each 1 decode token, 10 uJ, 0.05 s busy.
    rows = pd.DataFrame({"end_ns": np.arange(1, 11) * 100 * ms, "energy_uj": 10.0, "busy_s": 0.05,
                         "prefill_tokens": 0.0, "decode_tokens": 1.0, "spec_tokens": 0.0})
    merged, rest, start = merge_short_intervals(rows, 0)
    assert MIN_FIT_SPAN_NS == 900 * ms
    # 0-900 ms is the first interval at least 0.9 s long: nine rows summed, keyed by 900 ms.
    assert merged.to_dict("records") == [{"end_ns": 900 * ms, "energy_uj": 90.0, "busy_s": 0.05 * 9,
                                          "prefill_tokens": 0.0, "decode_tokens": 9.0, "spec_tokens": 0.0}]
    assert rest["end_ns"].tolist() == [1000 * ms] and start == 900 * ms
    # A 1 s sampler's intervals stay alone.
    one_s = rows.assign(end_ns=np.arange(1, 11) * 1000 * ms)
    merged, rest, start = merge_short_intervals(one_s, 0)
    assert merged["end_ns"].tolist() == one_s["end_ns"].tolist() and rest.empty and start == 10_000 * ms
