"""Which finished requests are slow: above a quantile of a rolling window of recent requests, or
over a user's latency SLO.

Quantile rule (no SLO set). Each batch of newly finished requests joins the window, the last
`window` finished requests across batches (polls). A new request is slow when its e2e is above the
window's q-quantile (linear interpolation, the new requests included), once the window holds
`min_requests`. At most ceil((1 - q) * len(window)) requests of the window are flagged at a time,
the slowest new ones first, so the flagged share is what the name says: at most 1% with p99. That
bound matters when latency climbs for everyone, e.g. a queue building up in a burst: each new
request is then slower than every one before it, and without the bound all of them would be
"above the p99". The climb itself shows in the latency histograms; a slow flag points at outliers.
A request must also be materially slower than the window's median (by `min_excess`, a fraction of
it): in a window of near-identical requests the quantile sits inside their jitter, and a request
a few milliseconds above it is noise, not a slow request with a cause.

SLO rule (any of slo_ttft_s, slo_itl_s, slo_e2e_s set; the quantile is then not used): a request
is slow when its ttft_s, itl_mean_s or e2e_s exceeds the SLO given for it. Every violation is
flagged, however many there are; the metric reported is the one exceeded by the largest ratio.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

VERDICT_DTYPES = {"request_id": "int64", "slow": "bool", "metric": "object", "value_s": "float64",
                  "threshold_s": "float64"}
#: SLO fields and the request_table column each one bounds.
SLO_COLUMNS = {"ttft": "ttft_s", "itl": "itl_mean_s", "e2e": "e2e_s"}


@dataclass(frozen=True)
class SlowRule:
    """What "slow" means. quantile in (0, 1) over the last `window` finished requests, used once
    `min_requests` have finished; or, when any slo_*_s is set, those SLOs (seconds) instead."""

    quantile: float = 0.99
    window: int = 1000
    min_requests: int = 20
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None
    slo_e2e_s: float | None = None
    min_excess: float = 0.25

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"the slow quantile must be in (0, 1), got {self.quantile}")
        if self.min_excess < 0:
            raise ValueError(f"min_excess must be >= 0, got {self.min_excess}")
        if self.window < 1 or self.min_requests < 1:
            raise ValueError(f"window and min_requests must be >= 1, got {self.window}, {self.min_requests}")
        for metric, slo in self.slos.items():
            if not slo > 0:
                raise ValueError(f"the {metric} SLO must be > 0 s, got {slo}")

    @property
    def slos(self) -> dict[str, float]:
        """metric (ttft, itl, e2e) -> SLO seconds, for the SLOs that are set."""
        given = {"ttft": self.slo_ttft_s, "itl": self.slo_itl_s, "e2e": self.slo_e2e_s}
        return {m: float(v) for m, v in given.items() if v is not None}

    @property
    def quantile_name(self) -> str:
        """p99 for 0.99, p99.9 for 0.999, p95 for 0.95."""
        return f"p{round(self.quantile * 100, 6):g}"

    def describe(self) -> str:
        """The rule in words, as findings and the summary state it."""
        if self.slos:
            return "over the SLO (" + ", ".join(f"{m.upper() if m != 'e2e' else m} {s:g} s"
                                                 for m, s in self.slos.items()) + ")"
        return f"above the rolling {self.quantile_name} e2e of the last {self.window} requests"

    def budget(self, window_size: int) -> int:
        """How many requests of a window of this size may be flagged at once (quantile rule)."""
        # round() first: (1 - 0.99) * 100 is 1.0000000000000009 in floating point.
        return math.ceil(round((1.0 - self.quantile) * window_size, 9))


def _verdicts(new: pd.DataFrame, slow: np.ndarray, metric: list[str], value: np.ndarray,
              threshold: np.ndarray) -> pd.DataFrame:
    # metric as an object column from the start (pandas 3 infers str from a list; the cast copies)
    out = pd.DataFrame({"request_id": new["request_id"].to_numpy(np.int64), "slow": slow,
                        "metric": pd.Series(metric, dtype=object), "value_s": value, "threshold_s": threshold})
    return out.astype(VERDICT_DTYPES) if any(out[c].dtype != t for c, t in VERDICT_DTYPES.items()) else out


def judge_slow(new: pd.DataFrame, window: pd.DataFrame, rule: SlowRule) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Verdicts on newly finished requests, and the window that follows.

    new: request_table() rows (request_id, e2e_s, ttft_s, itl_mean_s at least; any other columns,
    e.g. slow_causes features, are kept in the window), in finish order. window: what the previous
    call returned (an empty DataFrame the first time). Returns (verdicts, window'): verdicts has one
    row per new request: request_id, slow, metric (e2e | ttft | itl: what was judged), value_s (that
    metric's value), threshold_s (the quantile or the SLO it was held against; NaN while the window
    is shorter than min_requests). window' is window + new with a `slow` column, the last
    rule.window rows. Neither input is changed."""
    n = len(new)
    if rule.slos:
        ratios = np.column_stack([new[SLO_COLUMNS[m]].to_numpy(np.float64) / s for m, s in rule.slos.items()]
                                 ) if n else np.zeros((0, len(rule.slos)))
        metrics = list(rule.slos)
        # NaN (no first token: no TTFT, no ITL) never violates an SLO.
        worst = np.argmax(np.where(np.isnan(ratios), -np.inf, ratios), axis=1) if n else np.zeros(0, int)
        picked = ratios[np.arange(n), worst] if n else np.zeros(0)
        slow = np.nan_to_num(picked, nan=0.0) > 1.0
        metric = [metrics[i] for i in worst]
        threshold = np.array([rule.slos[m] for m in metric], dtype=np.float64)
        value = picked * threshold
        verdicts = _verdicts(new, slow, metric, value, threshold)
    else:
        e2e = new["e2e_s"].to_numpy(np.float64)
        # The e2e of the window after this batch (only that column: no frame is concatenated for it).
        window_e2e = e2e if window.empty else np.concatenate([window["e2e_s"].to_numpy(np.float64), e2e])
        window_e2e = window_e2e[-rule.window:]
        slow = np.zeros(n, dtype=bool)
        threshold = np.full(n, np.nan)
        if len(window_e2e) >= rule.min_requests and n:
            q = max(float(np.quantile(window_e2e, rule.quantile)),
                    float(np.median(window_e2e)) * (1.0 + rule.min_excess))
            threshold[:] = q
            # Old flags still inside the window use up the budget; new ones go slowest first.
            n_old = max(0, len(window_e2e) - n)
            old_flags = int(window["slow"].to_numpy(bool)[len(window) - n_old:].sum()) if n_old else 0
            room = max(0, rule.budget(len(window_e2e)) - old_flags)
            above = np.flatnonzero(e2e > q)
            slow[above[np.argsort(-e2e[above], kind="stable")][:room]] = True
        verdicts = _verdicts(new, slow, ["e2e"] * n, e2e, threshold)
    added = new.assign(slow=verdicts["slow"].to_numpy())
    out = added if window.empty else pd.concat([window, added], ignore_index=True)
    return verdicts, out.iloc[-rule.window:].reset_index(drop=True)
