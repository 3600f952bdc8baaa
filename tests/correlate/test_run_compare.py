"""correlate.run_compare: two runs' frames and summaries compared; every expected figure computed
here from the raw lists (numpy or plain arithmetic), never read back from the code under test."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.bootstrap import INSIDE_THE_NOISE
from infersight.correlate.requests import PARTS
from infersight.correlate.run_compare import CompareConfig, RunInputs, compare_runs

N = 200
SHIFT_S = 0.020  # B's TTFT and e2e are A's distribution plus 20 ms


def _rows(seed: int, shift_s: float) -> pd.DataFrame:
    """N requests: phases drawn at random; ttft = queue + prefill (+ shift), e2e = the phases' sum
    (+ shift, put on the queue); the mean ITL from the same distribution in both runs."""
    rng = np.random.default_rng(seed)
    phases = {"queue_s": rng.exponential(0.01, N) + shift_s, "prefill_s": rng.lognormal(-4.0, 0.2, N),
              "preemption_stall_s": np.zeros(N), "decode_s": rng.lognormal(-1.0, 0.05, N), "network_s": np.zeros(N)}
    return pd.DataFrame({**phases, "ttft_s": phases["queue_s"] + phases["prefill_s"],
                         "e2e_s": sum(phases.values()), "itl_mean_s": rng.lognormal(-4.5, 0.2, N)})


def _summary(requests: int, preemptions: int, matrix: list[list[int]], by_task: dict[str, dict]) -> dict:
    return {"requests": requests, "ttft_seconds": {"p50": 0.05, "p99": 0.2},
            "e2e_seconds": {"p50": 0.5, "p99": 1.5}, "itl_mean_seconds": {"p50": 0.01, "p99": 0.03},
            "phases_seconds_total": {"queue": 1.0, "prefill": 3.0, "preemption_stall": 0.0, "decode": 6.0,
                                     "network": 0.0},
            "prefix_cache": {"token_hit_rate": 0.25, "request_hit_rate": 0.5},
            "kv": {"preemptions": preemptions, "evictions": 3, "offloads": 2, "reloads": 1, "recomputed_tokens": 40},
            "moe": {"expert_tokens": matrix}, "spec": {"by_task": by_task}}


MATRIX_A = [[10, 10, 10, 10], [40, 0, 0, 0]]
MATRIX_B = [[25, 5, 5, 5], [10, 10, 10, 10]]
SPEC_A = {"chat": {"accept_rate": 0.6, "mean_accepted_length": 2.5, "predicted_speedup": 1.4},
          "code": {"accept_rate": 0.8, "mean_accepted_length": 3.2, "predicted_speedup": None}}
SPEC_B = {"chat": {"accept_rate": 0.5, "mean_accepted_length": 2.0, "predicted_speedup": 1.2}}


@pytest.fixture(scope="module")
def runs() -> tuple[RunInputs, RunInputs, dict]:
    a = RunInputs("A", _summary(N, 4, MATRIX_A, SPEC_A), _rows(1, 0.0))
    b = RunInputs("B", _summary(N, 10, MATRIX_B, SPEC_B), _rows(2, SHIFT_S))
    return a, b, compare_runs(a, b)


def test_percentiles_and_differences_are_numpys(runs) -> None:
    a, b, result = runs
    for metric in ("ttft_s", "itl_mean_s", "e2e_s"):
        for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
            d = result["latency"][metric][key]
            qa, qb = np.quantile(a.requests[metric].tolist(), q), np.quantile(b.requests[metric].tolist(), q)
            assert d["a"] == pytest.approx(qa, rel=1e-12) and d["b"] == pytest.approx(qb, rel=1e-12)
            assert d["b_minus_a"] == pytest.approx(qb - qa, rel=1e-9, abs=1e-15)
            assert d["interval_95"][0] <= d["interval_95"][1]


def test_a_known_shift_is_resolved_and_an_unchanged_metric_is_inside_the_noise(runs) -> None:
    _, _, result = runs
    for metric in ("ttft_s", "e2e_s"):
        p50 = result["latency"][metric]["p50"]
        low, high = p50["interval_95"]
        assert low > 0 and p50["verdict"] == "higher in b"
        assert low <= p50["b_minus_a"] <= high
        # The shift we put in, within the interval widened by its own width (a 95% interval misses
        # the truth one time in twenty; test_bootstrap checks the coverage over many samples).
        assert low - (high - low) <= SHIFT_S <= high + (high - low)
    # Mean ITL: the same distribution in both runs, different samples.
    itl = result["latency"]["itl_mean_s"]["p50"]
    assert itl["interval_95"][0] <= 0 <= itl["interval_95"][1] and itl["verdict"] == INSIDE_THE_NOISE


def test_a_a_comparisons_are_inside_the_noise_but_one_row_in_twenty() -> None:
    """Runs of one distribution (different samples): each p50 row's 95% interval holds 0 in about
    19 comparisons of 20, so over 20 pairs x 3 metrics about 3 rows of 60 are flagged by chance;
    10 or more would mean intervals far too narrow (binomial(60, 0.05): P(>= 10) < 0.3%)."""
    config = CompareConfig(quantiles=(0.5,), resamples=400)
    flagged = 0
    for seed in range(20):
        a = RunInputs("A", _summary(N, 4, MATRIX_A, SPEC_A), _rows(100 + seed, 0.0))
        a2 = RunInputs("A2", _summary(N, 4, MATRIX_A, SPEC_A), _rows(200 + seed, 0.0))
        latency = compare_runs(a, a2, config)["latency"]
        flagged += sum(m["p50"]["verdict"] != INSIDE_THE_NOISE for m in latency.values())
    assert flagged < 10


def test_the_same_seed_gives_the_same_intervals(runs) -> None:
    a, b, result = runs
    assert compare_runs(a, b)["latency"] == result["latency"]
    assert compare_runs(a, b, CompareConfig(seed=5))["latency"] != result["latency"]


def test_phase_shares_from_the_rows(runs) -> None:
    a, b, result = runs
    totals_a = {p: sum(a.requests[p].tolist()) for p in PARTS}
    totals_b = {p: sum(b.requests[p].tolist()) for p in PARTS}
    for p in PARTS:
        share_a, share_b = totals_a[p] / sum(totals_a.values()), totals_b[p] / sum(totals_b.values())
        got = result["phase_shares"][p]
        assert got["a"] == pytest.approx(share_a) and got["b"] == pytest.approx(share_b)
        assert got["b_minus_a"] == pytest.approx(share_b - share_a)


def test_summary_sections(runs) -> None:
    _, _, result = runs
    assert result["kv"]["preemptions"] == {"a": 4.0, "b": 10.0, "b_minus_a": 6.0}
    assert result["kv"]["preemptions_per_request"]["b_minus_a"] == pytest.approx((10 - 4) / N)
    assert result["prefix_cache"]["token_hit_rate"] == {"a": 0.25, "b": 0.25, "b_minus_a": 0.0}
    layers = result["expert_load"]["layers"]
    for layer, (ra, rb) in enumerate(zip(MATRIX_A, MATRIX_B)):
        imb_a, imb_b = max(ra) / (sum(ra) / len(ra)), max(rb) / (sum(rb) / len(rb))
        assert layers[layer]["layer"] == layer
        assert layers[layer]["tokens_a"] == sum(ra) and layers[layer]["tokens_b"] == sum(rb)
        assert layers[layer]["max_over_mean_a"] == pytest.approx(imb_a)
        assert layers[layer]["b_minus_a"] == pytest.approx(imb_b - imb_a)
    assert result["expert_load"]["worst_layer_max_over_mean"]["a"] == pytest.approx(4.0)
    chat = result["speculation"]["chat"]
    assert chat["accept_rate"]["b_minus_a"] == pytest.approx(0.5 - 0.6)
    assert chat["mean_accepted_length"] == {"a": 2.5, "b": 2.0, "b_minus_a": -0.5}
    assert result["speculation"]["code"] == {"absent": "absent in B"}


def test_sections_one_run_lacks_are_absent_and_a_summary_only_run_has_no_interval() -> None:
    full = RunInputs("full", _summary(N, 4, MATRIX_A, SPEC_A), _rows(1, 0.0))
    bare_summary = {"requests": 7, "ttft_seconds": {"p50": 0.1, "p99": None}, "kv": {"preemptions": 1}}
    bare = RunInputs("bare", bare_summary)
    result = compare_runs(full, bare)
    assert result["b"] == {"name": "bare", "requests": 7, "rows": None}
    p50 = result["latency"]["ttft_s"]["p50"]
    expected_a = np.quantile(full.requests["ttft_s"].tolist(), 0.5)
    assert p50["a"] == pytest.approx(expected_a) and p50["b"] == 0.1
    assert p50["b_minus_a"] == pytest.approx(0.1 - expected_a)
    assert p50["interval_95"] is None and p50["verdict"] == "no interval: per-request rows absent in bare"
    assert result["latency"]["ttft_s"]["p99"] == {"absent": "absent in bare"}
    assert result["latency"]["e2e_s"]["p50"] == {"absent": "absent in bare"}
    assert result["phase_shares"] == {"absent": "absent in bare"}
    assert result["prefix_cache"] == {"absent": "absent in bare"}
    assert result["kv"]["evictions"] == {"absent": "absent in bare"}
    assert result["expert_load"] == result["speculation"] == {"absent": "absent in bare"}
    both = compare_runs(bare, RunInputs("bare2", bare_summary))
    assert both["expert_load"] == {"absent": "absent in bare and bare2"}


def test_a_dense_run_has_no_expert_load_and_config_is_checked() -> None:
    moe_run = RunInputs("moe", _summary(N, 0, MATRIX_A, SPEC_A))
    dense = RunInputs("dense", _summary(N, 0, [], SPEC_A))
    assert compare_runs(moe_run, dense)["expert_load"] == {"absent": "absent in dense"}
    with pytest.raises(ValueError):
        CompareConfig(quantiles=(0.5, 1.0))
    with pytest.raises(ValueError):
        CompareConfig(resamples=10)
