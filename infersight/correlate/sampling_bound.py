"""How much a request's energy can be wrong because the energy counter is read only every so often.

Between two readings (t0, t1) of one GPU's cumulative counter, correlate.energy spreads the rise
dC evenly over time: a window of the interval gets dC x its length / (t1 - t0). The GPU's real
power P(t) is not even. Give a request its share g(t) of whatever runs at t (its modelled share of
the step running then, 0 in gaps and in steps without it); over the interval it is charged
(dC / dt) x L, with L = integral of g, while it drew integral of g x P. The difference is

    error = integral of g(t) x (P(t) - P_mean) dt,     P_mean = dC / dt.

With P(t) within [P_lo, P_hi] and range R = P_hi - P_lo, the error is largest when the high power
falls where g is largest. Knowing of g only its largest value g_max, the time T it is non-zero and
its integral L, the part of g on the top m ns is at most G(m) = min(g_max x min(m, T), L), and

    error <= R x G(m_hi) - (P_mean - P_lo) x L,   m_hi = (P_mean - P_lo) x dt / R   (charged too little)
    -error <= R x G(m_lo) - (P_hi - P_mean) x L,  m_lo = (P_hi - P_mean) x dt / R   (charged too much)

The bound of an interval is the larger of the two (never below 0); a request's bound is the sum
over the intervals and GPUs it ran in. It is 0 where g is constant over a whole interval (a request
alone and running throughout), and grows at a request's edges: an interval it covers only in part
can hold power it did not draw, or lose power it did. It bounds the sampling error only, for the
shares given: how right the shares themselves are is the split model's question (token_cost).

Frames:
  windows   request_id, start_ns, end_ns, share (float, 0..1): each member's disjoint step window
  readings  ts_ns, gpu, value: one GPU's cumulative counter (uJ), non-decreasing (correlate.energy)
  shares    request_id, gpu, t0_ns, dt_ns, rise, length_ns, covered_ns, share_max: per request, GPU
            and reading interval: the interval's start, length and counter rise, L, T and g_max
"""
from __future__ import annotations

import numpy as np
import pandas as pd

SHARE_COLUMNS = {"request_id": "int64", "gpu": "int64", "t0_ns": "int64", "dt_ns": "int64", "rise": "float64",
                 "length_ns": "float64", "covered_ns": "float64", "share_max": "float64"}


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in SHARE_COLUMNS.items()})


def interval_shares(windows: pd.DataFrame, readings: pd.DataFrame) -> pd.DataFrame:
    """shares (module docstring) of each request in each reading interval its windows overlap;
    window time outside every GPU's readings is left out (the counter says nothing there)."""
    rows = []
    w = windows[windows["end_ns"] > windows["start_ns"]]
    a, b = w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)
    rid, share = w["request_id"].to_numpy(np.int64), w["share"].to_numpy(np.float64)
    for gpu, g in readings.groupby("gpu", sort=True):
        g = g.sort_values("ts_ns", kind="stable").drop_duplicates("ts_ns", keep="last")
        ts = g["ts_ns"].to_numpy(np.int64)
        value = np.maximum.accumulate(g["value"].to_numpy(np.int64)).astype(np.float64)
        if len(ts) < 2 or len(w) == 0:
            continue
        # Intervals each window touches: [first, last] (a window longer than an interval spans several).
        first = np.clip(np.searchsorted(ts, a, side="right") - 1, 0, len(ts) - 2)
        last = np.clip(np.searchsorted(ts, b, side="left") - 1, 0, len(ts) - 2)
        count = np.maximum(last - first + 1, 0)
        row = np.repeat(np.arange(len(w)), count)
        k = np.repeat(first, count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count))
        overlap = np.minimum(b[row], ts[k + 1]) - np.maximum(a[row], ts[k])
        keep = overlap > 0
        row, k, overlap = row[keep], k[keep], overlap[keep].astype(np.float64)
        rows.append(pd.DataFrame({"request_id": rid[row], "gpu": int(gpu), "t0_ns": ts[k], "dt_ns": ts[k + 1] - ts[k],
                                  "rise": value[k + 1] - value[k], "length_ns": share[row] * overlap,
                                  "covered_ns": np.where(share[row] > 0, overlap, 0.0), "share_max": share[row]}))
    if not rows:
        return _empty()
    return merge_shares(pd.concat(rows, ignore_index=True))


def merge_shares(shares: pd.DataFrame) -> pd.DataFrame:
    """Rows of the same request, GPU and interval (from several polls) summed into one."""
    if shares.empty:
        return _empty()
    out = shares.groupby(["request_id", "gpu", "t0_ns"], as_index=False, sort=False).agg(
        dt_ns=("dt_ns", "first"), rise=("rise", "first"), length_ns=("length_ns", "sum"),
        covered_ns=("covered_ns", "sum"), share_max=("share_max", "max"))
    return out.astype(SHARE_COLUMNS)[list(SHARE_COLUMNS)]


def interval_bounds(shares: pd.DataFrame, power_lo: np.ndarray | float, power_hi: np.ndarray | float) -> np.ndarray:
    """The bound (module docstring) of each shares row, in the counter's unit; power_lo and
    power_hi (counter units per ns, per row or one for all) bound the GPU's power over the interval.
    A power_hi below the interval's own mean is taken as the mean (no interval can say less)."""
    dt = shares["dt_ns"].to_numpy(np.float64)
    mean = np.divide(shares["rise"].to_numpy(np.float64), dt, out=np.zeros(len(dt)), where=dt > 0)
    lo = np.minimum(np.broadcast_to(np.asarray(power_lo, np.float64), mean.shape), mean)
    hi = np.maximum(np.broadcast_to(np.asarray(power_hi, np.float64), mean.shape), mean)
    r = hi - lo
    length = shares["length_ns"].to_numpy(np.float64)
    covered = np.minimum(shares["covered_ns"].to_numpy(np.float64), dt)
    g_max = shares["share_max"].to_numpy(np.float64)

    def top(m: np.ndarray) -> np.ndarray:
        return np.minimum(g_max * np.minimum(m, covered), length)

    with np.errstate(divide="ignore", invalid="ignore"):
        m_hi = np.where(r > 0, (mean - lo) * dt / r, 0.0)
        m_lo = np.where(r > 0, (hi - mean) * dt / r, 0.0)
    under = r * top(m_hi) - (mean - lo) * length
    over = r * top(m_lo) - (hi - mean) * length
    return np.where(r > 0, np.maximum(np.maximum(under, over), 0.0), 0.0)
