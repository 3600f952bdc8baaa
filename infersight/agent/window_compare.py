"""Two time windows compared, for GET /api/v1/compare?a=START,END&b=START,END (Unix seconds).

A request belongs to the window its finish falls in (the engine's monotonic finish time, put on the
wall clock with the ring's anchor). Per window: request count, TTFT / e2e / mean ITL p50 and p99,
the phase totals, slow causes and tasks; then B against A: each p50's difference with a 95%
bootstrap interval (resampling each window's requests, seeded: the same rows give the same
interval), so a reader can tell a change from noise. Only the rows retention keeps are compared.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from infersight.agent.report import _clean
from infersight.agent.state import AgentState
from infersight.correlate.requests import PARTS

#: Resamples of the bootstrap interval, and its seed.
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
METRICS = ("ttft_s", "e2e_s", "itl_mean_s")
#: The longest window a request may name (a week): wider is a typo.
MAX_SPAN_S = 7 * 86400.0


def parse_window(raw: str, name: str) -> tuple[float, float]:
    """"START,END" in Unix seconds, START < END, at most MAX_SPAN_S apart; ValueError otherwise."""
    try:
        start, end = (float(v) for v in raw.split(","))
    except ValueError:
        raise ValueError(f"{name} must be START,END in Unix seconds, got {raw[:60]!r}") from None
    if not (math.isfinite(start) and math.isfinite(end) and start < end):
        raise ValueError(f"{name}: START must be before END (finite Unix seconds), got {raw[:60]!r}")
    if end - start > MAX_SPAN_S:
        raise ValueError(f"{name} spans more than {MAX_SPAN_S:g} s")
    return start, end


def _quantile(values: np.ndarray, q: float) -> float | None:
    return float(np.quantile(values, q)) if len(values) else None


def _window(rows: pd.DataFrame, start: float, end: float) -> dict[str, Any]:
    return {"start_s": start, "end_s": end, "requests": len(rows),
            **{m: {"p50": _quantile(rows[m].dropna().to_numpy(), 0.5), "p99": _quantile(rows[m].dropna().to_numpy(), 0.99)}
               for m in METRICS},
            "phases_seconds_total": {p: float(rows[p].sum()) for p in PARTS},
            "slow_causes": rows["slow_cause"][rows["slow_cause"] != ""].value_counts().to_dict() if len(rows) else {},
            "tasks": rows["task"].astype(str).value_counts().to_dict() if len(rows) else {}}


def p50_difference(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> dict[str, Any] | None:
    """median(b) - median(a) with a 95% percentile-bootstrap interval (None when a window is empty)."""
    if not len(a) or not len(b):
        return None
    idx_a = rng.integers(0, len(a), (BOOTSTRAP_RESAMPLES, len(a)))
    idx_b = rng.integers(0, len(b), (BOOTSTRAP_RESAMPLES, len(b)))
    diffs = np.median(b[idx_b], axis=1) - np.median(a[idx_a], axis=1)
    low, high = np.quantile(diffs, [0.025, 0.975])
    point = float(np.median(b) - np.median(a))
    return {"b_minus_a": point, "interval_95": [float(low), float(high)],
            "relative": point / float(np.median(a)) if np.median(a) else None,
            "verdict": "higher in b" if low > 0 else "lower in b" if high < 0 else "no change resolved"}


def compare_windows(state: AgentState, a: tuple[float, float], b: tuple[float, float]) -> dict[str, Any]:
    with state.lock:
        kept = state.finished.frame()
        wall_ns, mono_ns = state.wall_anchor
    if kept.empty:
        rows_a = rows_b = pd.DataFrame({c: [] for c in (*METRICS, *PARTS, "slow_cause", "task")})
    else:
        finish_wall = (wall_ns + kept["finish_ns"].to_numpy(np.int64) - mono_ns) / 1e9
        rows_a = kept[(finish_wall >= a[0]) & (finish_wall < a[1])]
        rows_b = kept[(finish_wall >= b[0]) & (finish_wall < b[1])]
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    diff = {m: p50_difference(rows_a[m].dropna().to_numpy(np.float64), rows_b[m].dropna().to_numpy(np.float64), rng)
            for m in METRICS}
    return _clean({"a": _window(rows_a, *a), "b": _window(rows_b, *b), "p50_difference": diff,
                   "kept_requests": len(kept),
                   "basis": {"windows": "measured: probe timestamps (finish time on the wall clock by the ring's "
                                        "anchor); only the requests retention keeps",
                             "p50_difference": f"measured medians; the interval is a {BOOTSTRAP_RESAMPLES}-resample "
                                               f"percentile bootstrap over each window's requests (seed "
                                               f"{BOOTSTRAP_SEED})"}})
