"""correlate.bootstrap: the quantile difference and its interval, against numpy on the raw samples."""
from __future__ import annotations

import numpy as np

from infersight.correlate.bootstrap import INSIDE_THE_NOISE, quantile_difference


def test_point_difference_is_numpys_and_the_interval_holds_it() -> None:
    a = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    b = np.array([2.0, 3.0, 5.0, 8.0])
    for q in (0.5, 0.9):
        d = quantile_difference(a, b, np.random.default_rng(1), q)
        assert d is not None
        assert d["b_minus_a"] == np.quantile(b, q) - np.quantile(a, q)
        assert d["relative"] == d["b_minus_a"] / np.quantile(a, q)
        low, high = d["interval_95"]
        # Every resampled quantile lies within the samples' range, so the interval does too.
        assert b.min() - a.max() <= low <= high <= b.max() - a.min()


def test_a_shift_is_resolved_and_equal_samples_are_not() -> None:
    rng = np.random.default_rng(7)
    a = rng.lognormal(-3.0, 0.3, 300)
    shifted = quantile_difference(a, a + 0.01, np.random.default_rng(0))
    assert shifted is not None and shifted["verdict"] == "higher in b" and shifted["interval_95"][0] > 0
    assert abs(shifted["b_minus_a"] - 0.01) < 1e-12
    lower = quantile_difference(a + 0.01, a, np.random.default_rng(0))
    assert lower is not None and lower["verdict"] == "lower in b" and lower["interval_95"][1] < 0
    same = quantile_difference(a, rng.permutation(a), np.random.default_rng(0))
    assert same is not None and same["b_minus_a"] == 0.0 and same["verdict"] == INSIDE_THE_NOISE


def test_same_seed_same_interval_and_empty_is_none() -> None:
    a, b = np.arange(20.0), np.arange(5.0, 25.0)
    first = quantile_difference(a, b, np.random.default_rng(3), 0.99)
    assert first == quantile_difference(a, b, np.random.default_rng(3), 0.99)
    assert quantile_difference(np.empty(0), b, np.random.default_rng(0)) is None
    assert quantile_difference(a, np.empty(0), np.random.default_rng(0)) is None


def test_the_interval_covers_a_known_shift_about_95_times_in_100() -> None:
    """Coverage over 100 pairs of fresh samples (B = another sample of A's distribution + 5 ms): a
    percentile-bootstrap 95% interval of a median holds the true shift in roughly 95 of them;
    below 85 would mean a broken interval (binomial: P(<= 85 of 100 at 0.95) < 0.1%)."""
    rng = np.random.default_rng(11)
    covered = 0
    for _ in range(100):
        a, b = rng.lognormal(-3.0, 0.3, 100), rng.lognormal(-3.0, 0.3, 100) + 0.005
        d = quantile_difference(a, b, rng, resamples=400)
        assert d is not None
        covered += d["interval_95"][0] <= 0.005 <= d["interval_95"][1]
    assert covered >= 85
