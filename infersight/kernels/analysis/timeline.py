"""Where GPU time goes on the timeline: busy vs idle per stream and device, per phase, top kernels.

Busy time is the union of activity intervals (overlapping kernels on several streams count once),
so busy + idle = span exactly. Idle time only means something inside a window of work: a step
(step_id >= 0) or, for kernels outside steps, a run of activity whose gaps stay below
`window_gap_ns` (100 µs by default: gaps of the size of launch latency and Python overhead; a
longer pause is the program doing something else, e.g. between benchmark iterations).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.kernels.frames import empty_frame

WINDOW_GAP_NS = 100_000

GAP_COLUMNS = {"device": "int64", "stream": "int64", "activities": "int64", "busy_ns": "int64", "span_ns": "int64",
               "idle_ns": "int64", "idle_share": "float64", "gaps": "int64", "short_idle_ns": "int64",
               "max_gap_ns": "int64"}
PHASE_COLUMNS = {"phase": "object", "steps": "int64", "activities": "int64", "kernel_ns": "int64", "share": "float64",
                 "window_ns": "int64", "busy_ns": "int64", "idle_ns": "int64", "idle_share": "float64",
                 "mean_kernel_ns": "float64"}
TOP_COLUMNS = {"name": "object", "op_category": "object", "count": "int64", "total_ns": "int64", "mean_ns": "float64",
               "share": "float64"}


def _group_start(d: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """True on the first row of each group of a frame sorted by keys."""
    codes = pd.factorize(pd.MultiIndex.from_frame(d[keys]))[0] if len(d) else np.zeros(0, np.int64)
    return np.r_[True, codes[1:] != codes[:-1]] if len(codes) else np.zeros(0, bool)


def _prev_max_end(d: pd.DataFrame, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(latest end among the group's earlier rows, is-first-of-group) for a frame sorted by keys and
    ts_ns. All int64: epoch-ns timestamps (~1.7e18) are not exact in float64."""
    end = d["ts_ns"] + d["dur_ns"]
    cummax = end.groupby([d[k] for k in keys], sort=False).cummax().to_numpy(np.int64)
    first = _group_start(d, keys)
    prev = np.roll(cummax, 1)
    return np.where(first, d["ts_ns"].to_numpy(np.int64), prev), first


def _union_parts(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per row (sorted by keys, ts_ns): `_busy`, its contribution to the union of intervals in its
    group, and `_gap`, the idle time before it since the group's earlier activity ended (0 first)."""
    d = df.sort_values(keys + ["ts_ns"], kind="stable")
    prev, first = _prev_max_end(d, keys)
    start = d["ts_ns"].to_numpy(np.int64)
    end = start + d["dur_ns"].to_numpy(np.int64)
    busy = np.maximum(end - np.maximum(start, prev), 0)
    gap = np.where(first, 0, np.maximum(start - prev, 0))
    return d.assign(_busy=busy, _gap=gap)


def idle_gaps(kernels: pd.DataFrame, window_gap_ns: int = WINDOW_GAP_NS) -> pd.DataFrame:
    """Per (device, stream), and per device over all its streams (stream -1): activities, busy_ns,
    span_ns (first start to last end), idle_ns = span - busy, idle_share, gaps (idle stretches),
    short_idle_ns (idle in gaps shorter than window_gap_ns: the launch-sized part), max_gap_ns."""
    if kernels.empty:
        return empty_frame(GAP_COLUMNS)
    per_stream = kernels[["device", "stream", "ts_ns", "dur_ns"]]
    per_device = per_stream.assign(stream=-1)
    rows = []
    for frame in (per_device, per_stream):
        parts = _union_parts(frame, ["device", "stream"])
        end = parts["ts_ns"] + parts["dur_ns"]
        g = parts.assign(_end=end, _short=np.where(parts["_gap"] < window_gap_ns, parts["_gap"], 0),
                         _has=(parts["_gap"] > 0).astype(np.int64)).groupby(["device", "stream"])
        agg = g.agg(activities=("ts_ns", "size"), busy_ns=("_busy", "sum"), first=("ts_ns", "min"),
                    last=("_end", "max"), gaps=("_has", "sum"), short_idle_ns=("_short", "sum"),
                    max_gap_ns=("_gap", "max")).reset_index()
        rows.append(agg)
    out = pd.concat(rows, ignore_index=True)
    span = out["last"] - out["first"]
    out = out.assign(span_ns=span, idle_ns=span - out["busy_ns"],
                     idle_share=np.where(span > 0, (span - out["busy_ns"]) / span.where(span > 0, 1), 0.0))
    return out[list(GAP_COLUMNS)].astype(GAP_COLUMNS)


def _windows(classified: pd.DataFrame, window_gap_ns: int) -> pd.Series:
    """A window id per row: (step_id) inside steps; outside, runs split at gaps >= window_gap_ns
    (numbered below -1 so they never collide with step ids)."""
    outside = classified[classified["step_id"] < 0].sort_values(["device", "phase", "ts_ns"], kind="stable")
    prev, first = _prev_max_end(outside, ["device", "phase"])
    new_run = first | (outside["ts_ns"].to_numpy(np.int64) - prev >= window_gap_ns)
    window = pd.Series(classified["step_id"].to_numpy(np.int64), index=classified.index)
    window.loc[outside.index] = -2 - np.cumsum(new_run)
    return window


def phase_breakdown(classified: pd.DataFrame, window_gap_ns: int = WINDOW_GAP_NS) -> pd.DataFrame:
    """Per phase (classify()'s phase): steps (distinct step ids), activities, kernel_ns, share of
    all GPU time, window_ns (summed spans of its windows: per device, per step, from its first
    kernel to its last), busy_ns (union), idle_ns = window - busy, idle_share, mean_kernel_ns.
    Sorted by kernel_ns."""
    if classified.empty:
        return empty_frame(PHASE_COLUMNS)
    d = classified.assign(_window=_windows(classified, window_gap_ns))
    parts = _union_parts(d, ["device", "phase", "_window"])
    per_window = parts.assign(_end=parts["ts_ns"] + parts["dur_ns"]).groupby(["device", "phase", "_window"]).agg(
        first=("ts_ns", "min"), last=("_end", "max"), busy=("_busy", "sum")).reset_index()
    per_window = per_window.assign(span=per_window["last"] - per_window["first"])
    win = per_window.groupby("phase").agg(window_ns=("span", "sum"), busy_ns=("busy", "sum"))
    k = classified.groupby("phase").agg(activities=("dur_ns", "size"), kernel_ns=("dur_ns", "sum"))
    steps = classified[classified["step_id"] >= 0].groupby("phase")["step_id"].nunique()
    out = k.join(win).assign(steps=steps.reindex(k.index).fillna(0).astype(np.int64)).reset_index()
    total = out["kernel_ns"].sum()
    idle = out["window_ns"] - out["busy_ns"]
    out = out.assign(share=out["kernel_ns"] / total if total else 0.0, idle_ns=idle,
                     idle_share=np.where(out["window_ns"] > 0, idle / out["window_ns"].where(out["window_ns"] > 0, 1), 0.0),
                     mean_kernel_ns=out["kernel_ns"] / out["activities"])
    out = out.sort_values(["kernel_ns", "phase"], ascending=[False, True], kind="stable")
    return out[list(PHASE_COLUMNS)].astype(PHASE_COLUMNS).reset_index(drop=True)


def category_breakdown(classified: pd.DataFrame) -> pd.DataFrame:
    """op_category, count, total_ns, share (of all GPU time), sorted by total_ns."""
    total = int(classified["dur_ns"].sum())
    g = classified.groupby("op_category").agg(count=("dur_ns", "size"), total_ns=("dur_ns", "sum")).reset_index()
    g = g.assign(share=g["total_ns"] / total if total else 0.0)
    return g.sort_values(["total_ns", "op_category"], ascending=[False, True], kind="stable").reset_index(drop=True)


def top_kernels(classified: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The n names with the most GPU time: name, op_category, count, total_ns, mean_ns, share."""
    if classified.empty:
        return empty_frame(TOP_COLUMNS)
    total = int(classified["dur_ns"].sum())
    g = classified.groupby("name", sort=False).agg(op_category=("op_category", "first"), count=("dur_ns", "size"),
                                                   total_ns=("dur_ns", "sum")).reset_index()
    g = g.assign(mean_ns=g["total_ns"] / g["count"], share=g["total_ns"] / total if total else 0.0)
    g = g.sort_values(["total_ns", "name"], ascending=[False, True], kind="stable").head(n)
    return g[list(TOP_COLUMNS)].astype(TOP_COLUMNS).reset_index(drop=True)
