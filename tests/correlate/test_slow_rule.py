"""judge_slow on hand-built rows: the window spans calls (polls), the flagged share is bounded by the
quantile's name, SLOs replace the quantile. Expected values are worked out in the comments."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.slow_rule import VERDICT_DTYPES, SlowRule, judge_slow


def rows(e2e: list[float], start_id: int = 0, ttft: list[float] | None = None,
         itl: list[float] | None = None) -> pd.DataFrame:
    n = len(e2e)
    return pd.DataFrame({"request_id": np.arange(start_id, start_id + n), "e2e_s": e2e,
                         "ttft_s": ttft if ttft is not None else [np.nan] * n,
                         "itl_mean_s": itl if itl is not None else [np.nan] * n})


def feed(batches: list[pd.DataFrame], rule: SlowRule, flags_seen: list[int] | None = None
         ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every batch through judge_slow in turn, as the agent does once per poll (flags_seen: the
    window's flagged count after each)."""
    window, verdicts = pd.DataFrame(), []
    for b in batches:
        v, window = judge_slow(b, window, rule)
        verdicts.append(v)
        if flags_seen is not None:
            flags_seen.append(int(window["slow"].sum()))
    return pd.concat(verdicts, ignore_index=True), window


def test_jitter_around_the_median_is_not_slow() -> None:
    # Twenty requests of 1.00..1.19 s: p90 is 1.171 s, but nothing is 25% above the median (1.095 s):
    # with the default min_excess nothing is flagged; 1.40 s (28% above) is.
    rule = SlowRule(quantile=0.9, window=100, min_requests=10)
    v, _ = feed([rows([1.0 + i / 100 for i in range(20)]), rows([1.40], 20)], rule)
    assert list(v["slow"]) == [False] * 20 + [True]
    assert v["threshold_s"].iloc[-1] == pytest.approx(np.median([1.0 + i / 100 for i in range(20)] + [1.40]) * 1.25)


def test_the_window_spans_polls() -> None:
    rule = SlowRule(quantile=0.5, window=6, min_requests=4, min_excess=0.0)
    # Poll 1: 3 rows < min_requests: not judged. Poll 2: window [1, 2, 3, 4, 10]; median 3; above it
    # 4 and 10; budget ceil(0.5 * 5) = 3, none used: both flagged. Poll 3: window (last 6) [2, 3, 4, 10, 5, 6],
    # median 4.5; 5 and 6 above it; budget ceil(0.5 * 6) = 3 minus 4 and 10 still inside = 1: 6 (slowest first).
    v, window = feed([rows([1, 2, 3]), rows([4, 10], 3), rows([5, 6], 5)], rule)
    assert v.dtypes.to_dict() == {k: np.dtype(t) if t != "object" else np.dtype("O") for k, t in VERDICT_DTYPES.items()}
    assert list(v["slow"]) == [False, False, False, True, True, False, True]
    assert list(v["threshold_s"][:3].isna()) == [True] * 3
    assert list(v["threshold_s"][3:]) == [3.0, 3.0, 4.5, 4.5]
    assert list(window["request_id"]) == [1, 2, 3, 4, 5, 6] and list(window["slow"]) == [False] * 2 + [True] * 2 + [
        False, True]


def test_rising_latency_flags_at_most_the_quantiles_share() -> None:
    # The "22 of 96 above the p99": every request slower than all before it (a queue building up).
    rule = SlowRule(quantile=0.99, window=1000, min_requests=20)
    v, _ = feed([rows([float(i)], i) for i in range(1, 201)], rule)
    # Judging starts at 20 requests: 20 > p99 of [1..20] (19.81), budget ceil(0.2) = 1. The budget grows
    # to 2 at 101 requests: 101 is flagged. Then none until 201.
    assert list(v.loc[v["slow"], "request_id"]) == [20, 101]
    v96, _ = feed([rows([float(i)], i) for i in range(1, 97)], rule)
    assert int(v96["slow"].sum()) == 1


def test_a_stationary_workload_flags_about_the_quantiles_share() -> None:
    rng = np.random.default_rng(0)
    e2e = rng.lognormal(-1.0, 0.5, 8000)
    rule = SlowRule(quantile=0.99, window=1000, min_requests=20)
    batches = [rows(list(e2e[i:i + 20]), i) for i in range(0, len(e2e), 20)]  # 20 requests per poll
    flags: list[int] = []
    v, window = feed(batches, rule, flags)
    # About 1%: a little under, since a flag stays in the window (and uses the budget) for 1000 requests.
    share = float(v["slow"].mean())
    assert 0.007 <= share <= 0.0101, share
    # After every poll, never more than ceil(1% of 1000) = 10 flagged among the last 1000 requests.
    assert max(flags) == 10 and len(window) == 1000


def test_slos_replace_the_quantile() -> None:
    rule = SlowRule(slo_ttft_s=0.5, slo_e2e_s=2.0)
    new = rows([1.0, 3.0, 1.9, 2.2, 0.1], ttft=[0.6, 0.1, 0.4, 1.5, np.nan])
    v, window = judge_slow(new, pd.DataFrame(), rule)
    # r0: ttft 1.2x its SLO; r1: e2e 1.5x; r2: none over; r3: ttft 3x beats e2e 1.1x; r4: no first token,
    # e2e 0.05x: NaN never violates. Every violation counts, even with min_requests (20) not reached.
    assert list(v["slow"]) == [True, True, False, True, False]
    assert list(v["metric"][[0, 1, 3]]) == ["ttft", "e2e", "ttft"]
    assert list(v["threshold_s"][[0, 1, 3]]) == [0.5, 2.0, 0.5]
    assert list(v["value_s"][[0, 1, 3]]) == pytest.approx([0.6, 3.0, 1.5])
    assert len(window) == 5  # the window is kept under an SLO too: the typical request for attribution


def test_rule_names_and_validation() -> None:
    assert SlowRule().quantile_name == "p99" and SlowRule(quantile=0.999).quantile_name == "p99.9"
    assert SlowRule(quantile=0.95, window=500).describe() == "above the rolling p95 e2e of the last 500 requests"
    assert SlowRule(slo_ttft_s=0.25, slo_itl_s=0.05).describe() == "over the SLO (TTFT 0.25 s, ITL 0.05 s)"
    assert SlowRule().budget(100) == 1 and SlowRule().budget(101) == 2  # not 2 at 100: float rounding
    for bad in ({"quantile": 1.0}, {"quantile": 0.0}, {"window": 0}, {"slo_e2e_s": 0.0}, {"slo_itl_s": -1.0}):
        with pytest.raises(ValueError):
            SlowRule(**bad)


def test_inputs_are_not_changed() -> None:
    new, window = rows([1.0, 5.0], 10), feed([rows([1.0] * 30)], SlowRule())[1]
    before_new, before_window = new.copy(deep=True), window.copy(deep=True)
    judge_slow(new, window, SlowRule())
    pd.testing.assert_frame_equal(new, before_new)
    pd.testing.assert_frame_equal(window, before_window)
