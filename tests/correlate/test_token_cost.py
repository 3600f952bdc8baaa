"""correlate.token_cost: the step-time fit against scipy's NNLS on the raw rows, members' kinds from
step totals and chunk events, and the weights by hand."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import nnls

from infersight.correlate.token_cost import (
    MIN_FIT_STEPS, WEIGHT_BITS, TokenCosts, fit_token_costs, member_tokens, member_weights, normal_equations,
)


def _steps(rows: list[tuple[int, int, int, int, int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["step_id", "start_ns", "end_ns", "batch_size", "prefill_tokens",
                                       "decode_tokens", "spec_tokens"])


def _random_steps(seed: int, coefs: tuple[float, float, float, float], n: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    p = rng.integers(0, 300, n) * (rng.random(n) < 0.4)
    d = rng.integers(1, 32, n)
    s = rng.integers(0, 4, n) * d * (rng.random(n) < 0.5)
    dur = coefs[0] + coefs[1] * p + coefs[2] * d + coefs[3] * s + rng.normal(0, 2e5, n)
    start = np.arange(n) * 100_000_000
    return _steps(list(zip(range(n), start, start + np.maximum(dur, 1).astype(np.int64), d + (p > 0), p, d, s)))


@pytest.mark.parametrize("coefs", [(3e6, 2e4, 4e5, 1e5), (3e6, 2e4, -1e5, 3e5)])
def test_fit_matches_scipy_nnls_on_the_raw_rows(coefs: tuple[float, float, float, float]) -> None:
    steps = _random_steps(1, coefs)
    # Summed over two halves, as polls would: the same fit as over the whole.
    a, b = normal_equations(steps.iloc[:77]), normal_equations(steps.iloc[77:])
    fit = fit_token_costs(a[0] + b[0], a[1] + b[1], a[2] + b[2])
    x = np.column_stack([np.ones(len(steps)), steps["prefill_tokens"], steps["decode_tokens"], steps["spec_tokens"]])
    y = (steps["end_ns"] - steps["start_ns"]).to_numpy(np.float64)
    expected, _ = nnls(x.astype(np.float64), y)
    assert [fit.intercept_ns, fit.prefill_ns, fit.decode_ns, fit.spec_ns] == pytest.approx(expected, rel=1e-6, abs=1e-3)
    assert fit.usable and fit.steps == len(steps)
    if coefs[2] < 0:  # a negative truth: the constraint binds and the coefficient is 0
        assert fit.decode_ns == 0.0


def test_fit_is_not_usable_on_too_few_steps_or_kinds_it_cannot_tell_apart() -> None:
    few = _random_steps(2, (1e6, 1e4, 1e5, 0), n=MIN_FIT_STEPS - 1)
    assert not fit_token_costs(*normal_equations(few)).usable
    # Every step one decode token: decode cannot be told from the intercept.
    flat = _steps([(i, i * 10, i * 10 + 5 + (i % 2), 1, 0, 1, 0) for i in range(20)])
    assert not fit_token_costs(*normal_equations(flat)).usable
    # Steps that ran nobody are not samples of step time.
    idle = _steps([(i, 0, 7, 0, 0, 0, 0) for i in range(20)])
    assert normal_equations(idle)[2] == 0


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
    costs = TokenCosts(intercept_ns=3e6, prefill_ns=2e4, decode_ns=4e5, spec_ns=1e5, steps=50, usable=True)
    cost = [Fraction(20_000 * 100), Fraction(400_000), Fraction(400_000 + 2 * 100_000)]  # the intercept in none
    expected = [round(c / sum(cost) * 2**WEIGHT_BITS) for c in cost] + [1, 1]  # step 2: unresolved, token share
    assert member_weights(members, costs).tolist() == expected
    # The intercept split equally instead: each member's Shapley share of the step's fixed cost.
    equal = [c + Fraction(3_000_000, 3) for c in cost]
    assert member_weights(members, costs, "equal").tolist() == [
        round(c / sum(equal) * 2**WEIGHT_BITS) for c in equal] + [1, 1]
    # Per-token times all 0 (every step's time in its intercept): token share.
    assert member_weights(members, TokenCosts(intercept_ns=5e6, usable=True)).tolist() == [100, 1, 3, 1, 1]
    # An unusable fit: token share everywhere.
    assert member_weights(members, TokenCosts()).tolist() == [100, 1, 3, 1, 1]
