"""Two time windows compared, for GET /api/v1/compare?a=START,END&b=START,END (Unix seconds).

A request belongs to the window its finish falls in (the engine's monotonic finish time, put on the
wall clock with the ring's anchor). Per window: request count, TTFT / e2e / mean ITL p50 and p99,
the phase totals, slow causes and tasks; then B against A: each p50's difference with a 95%
bootstrap interval (correlate.bootstrap, resampling each window's requests, seeded: the same rows give the same
interval), so a reader can tell a change from noise. Only the rows retention keeps are compared.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from infersight.agent.api.report import _clean
from infersight.agent.state import AgentState
from infersight.correlate.bootstrap import BOOTSTRAP_RESAMPLES, quantile_difference
from infersight.correlate.requests import PARTS

#: The bootstrap interval's seed (its resamples: correlate.bootstrap).
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
    values = {m: rows[m].dropna().to_numpy() for m in METRICS}
    return {"start_s": start, "end_s": end, "requests": len(rows),
            **{m: {"p50": _quantile(v, 0.5), "p99": _quantile(v, 0.99)} for m, v in values.items()},
            "phases_seconds_total": {p: float(rows[p].sum()) for p in PARTS},
            "slow_causes": rows["slow_cause"][rows["slow_cause"] != ""].value_counts().to_dict() if len(rows) else {},
            "tasks": rows["task"].astype(str).value_counts().to_dict() if len(rows) else {}}


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
    diff = {m: quantile_difference(rows_a[m].dropna().to_numpy(np.float64), rows_b[m].dropna().to_numpy(np.float64),
                                  rng)
            for m in METRICS}
    return _clean({"a": _window(rows_a, *a), "b": _window(rows_b, *b), "p50_difference": diff,
                   "kept_requests": len(kept),
                   "basis": {"windows": "measured: probe timestamps (finish time on the wall clock by the ring's "
                                        "anchor); only the requests retention keeps",
                             "p50_difference": f"measured medians; the interval is a {BOOTSTRAP_RESAMPLES}-resample "
                                               f"percentile bootstrap over each window's requests (seed "
                                               f"{BOOTSTRAP_SEED})"}})
