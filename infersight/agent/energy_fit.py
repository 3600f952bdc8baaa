"""EnergyFit: the energy model the agent splits steps' energy by, refitted as readings come.

correlate.token_cost fits the GPU's static power and dynamic joules per prefill, decode and draft
token on the measured energy of the counter's intervals (the time between two readings of the
first GPU's energy counter). An interval enters the fit once complete: once the account has passed
its end, so that no later step can still fall in it. The fit is least squares kept as running
normal equations (X'X, X'y), so each interval is added once and nothing of it is kept after.
Complete intervals shorter than min_span_ns are merged with the next ones until they are that long
(the agent's default, GpuConfig.energy_fit_min_s, is token_cost.MIN_FIT_SPAN_NS: why, there).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.correlate import token_cost as T


class EnergyFit:
    def __init__(self, min_span_ns: int = 0) -> None:
        k = len(T.REGRESSORS)
        self.min_span_ns = min_span_ns
        self.xtx, self.xty, self.intervals = np.zeros((k, k)), np.zeros(k), 0
        self.open_rows = T.interval_rows(pd.DataFrame(), np.empty(0, np.int64))  # intervals not complete yet
        self.short_rows = self.open_rows  # complete intervals waiting to be merged into a long enough one
        self.short_from_ns: int | None = None  # where short_rows begin (the first reading, at first)
        self.costs = T.TokenCosts()  # the last fit (not usable until the intervals can tell the kinds apart)

    def add(self, measured: pd.DataFrame, reading_ns: np.ndarray, to_ns: int,
            static_w: float | None = None) -> T.TokenCosts:
        """Add measured steps that ran a batch (step_id, the step-kind token columns, start_ns, end_ns,
        energy_uj) to the intervals between the sorted reading times `reading_ns`; those ending by to_ns
        are complete and enter the fit. static_w: the GPU's measured idle power, to hold the static term
        at (token_cost.fit_token_costs); None fits it. Returns the fit after them."""
        rows = T.interval_rows(measured, reading_ns)
        if not self.open_rows.empty:
            rows = pd.concat([self.open_rows, rows], ignore_index=True).groupby("end_ns", as_index=False).sum()
        complete = rows["end_ns"].to_numpy(np.int64) <= to_ns
        if self.short_from_ns is None and len(reading_ns):
            self.short_from_ns = int(reading_ns[0])
        merged, self.short_rows, self.short_from_ns = T.merge_short_intervals(
            pd.concat([self.short_rows, rows[complete]], ignore_index=True) if not self.short_rows.empty
            else rows[complete].reset_index(drop=True), self.short_from_ns or 0, self.min_span_ns)
        xtx, xty, n = T.normal_equations(merged)
        self.xtx, self.xty, self.intervals = self.xtx + xtx, self.xty + xty, self.intervals + n
        self.open_rows = rows[~complete].reset_index(drop=True)
        self.costs = T.fit_token_costs(self.xtx, self.xty, self.intervals, static_w)
        return self.costs
