"""The loop's two verdicts, each a measured difference with a 95% percentile-bootstrap interval:

- arm_verdict: median per-output-token latency (tpot_s) of a canary's treatment arm minus its control
  arm (correlate.bootstrap.quantile_difference): "better" when the whole interval is below 0 (the
  change made decode faster), "worse" when it is above 0, "inconclusive" when it holds 0.
- slo_verdict: the share of requests meeting the SLO (TTFT <= objective and mean ITL <= objective)
  under a candidate setting minus under the current one: "better" when the whole interval is above 0.

Both are pure functions of the samples and a seeded Generator: the same rows give the same verdict.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from infersight.correlate.bootstrap import quantile_difference

BETTER, WORSE, INCONCLUSIVE = "better", "worse", "inconclusive"


def arm_verdict(control: np.ndarray, treatment: np.ndarray, rng: np.random.Generator,
                resamples: int = 1000) -> dict[str, Any]:
    """control / treatment: per-output-token latencies (seconds) of each arm's finished requests.
    Keys: verdict, control_n, treatment_n, control_median_s, treatment_median_s, difference_s
    (treatment - control), interval_95_s, relative (difference / control median), basis."""
    control, treatment = control[np.isfinite(control)], treatment[np.isfinite(treatment)]
    out: dict[str, Any] = {"control_n": int(len(control)), "treatment_n": int(len(treatment)),
                           "basis": "measured: median per-output-token latency (FINISHED - FIRST_TOKEN) / "
                                    "(tokens - 1) of each arm's requests, probe timestamps"}
    diff = quantile_difference(control, treatment, rng, q=0.5, resamples=resamples)
    if diff is None:
        return {**out, "verdict": INCONCLUSIVE}
    low, high = diff["interval_95"]
    verdict = WORSE if low > 0 else BETTER if high < 0 else INCONCLUSIVE
    return {**out, "verdict": verdict, "control_median_s": float(np.median(control)),
            "treatment_median_s": float(np.median(treatment)), "difference_s": diff["b_minus_a"],
            "interval_95_s": [low, high], "relative": diff["relative"]}


def mean_difference(a: np.ndarray, b: np.ndarray, rng: np.random.Generator,
                    resamples: int = 1000) -> tuple[float, float, float] | None:
    """mean(b) - mean(a) and its 95% percentile-bootstrap interval (each resample draws len(a) from a
    and len(b) from b with replacement); None when either is empty."""
    if not len(a) or not len(b):
        return None
    ma = a[rng.integers(0, len(a), (resamples, len(a)))].mean(axis=1)
    mb = b[rng.integers(0, len(b), (resamples, len(b)))].mean(axis=1)
    low, high = np.quantile(mb - ma, [0.025, 0.975])
    return float(b.mean() - a.mean()), float(low), float(high)


def slo_met(ttft_s: np.ndarray, tpot_s: np.ndarray, slo_ttft_s: float, slo_itl_s: float) -> np.ndarray:
    """Per request: TTFT within its objective and mean ITL within its (a one-token request has no
    ITL: only its TTFT counts)."""
    itl_ok = np.where(np.isfinite(tpot_s), tpot_s <= slo_itl_s, True)
    return (ttft_s <= slo_ttft_s) & itl_ok


def slo_verdict(current: np.ndarray, candidate: np.ndarray, rng: np.random.Generator,
                resamples: int = 1000) -> dict[str, Any]:
    """current / candidate: per request, whether it met the SLO (bools). Keys: verdict, current_n,
    candidate_n, current_met, candidate_met (shares), difference (candidate - current), interval_95."""
    a, b = current.astype(np.float64), candidate.astype(np.float64)
    out: dict[str, Any] = {"current_n": int(len(a)), "candidate_n": int(len(b)),
                           "basis": "measured: share of requests with TTFT and mean ITL within the SLO, probe "
                                    "timestamps, requests that arrived and finished inside one window"}
    diff = mean_difference(a, b, rng, resamples)
    if diff is None:
        return {**out, "verdict": INCONCLUSIVE}
    point, low, high = diff
    verdict = BETTER if low > 0 else WORSE if high < 0 else INCONCLUSIVE
    return {**out, "verdict": verdict, "current_met": float(a.mean()), "candidate_met": float(b.mean()),
            "difference": point, "interval_95": [low, high]}
