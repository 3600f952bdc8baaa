"""Nesting of annotation ranges and "which range encloses this instant" lookups.

Push/pop ranges (NVTX, record_function) nest per thread by construction, so one sweep per
thread in start order, keeping the open ranges on a stack, gives every range its depth, its
path and its parent. The innermost open range is then a piecewise-constant function of time;
its breakpoints (a range's start, a range's end handing back to its parent) make each lookup a
binary search, vectorised over all the instants of one thread.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: Columns nest_ranges adds for enclosing_range; ingesters drop them from the public frame.
HELPER_COLUMNS = ["parent", "end_clip_ns"]


def _step_ordinals(names: np.ndarray, ts: np.ndarray, payload: pd.Series) -> np.ndarray:
    """Per range: its step id if it is named "step" (payload, else ordinal by start), else -1."""
    out = np.full(len(names), -1, dtype=np.int64)
    is_step = names == "step"
    order = np.flatnonzero(is_step)[np.argsort(ts[is_step], kind="stable")]
    out[order] = np.arange(len(order), dtype=np.int64)
    has_payload = is_step & payload.notna().to_numpy()
    out[has_payload] = payload[has_payload].astype(np.int64).to_numpy()
    return out


def nest_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    """A new frame of the same ranges, sorted by (process, thread, ts_ns, longest first), with
    depth, path and step_id filled and two helpers: parent (row position in the result, -1) and
    end_clip_ns (end clipped to the parent's, so that a child that outlives its parent by a
    rounding error stays nested).

    Input columns used: name, ts_ns, dur_ns, process, thread, payload. Others are carried."""
    df = ranges.sort_values(["process", "thread", "ts_ns", "dur_ns"], ascending=[True, True, True, False],
                            kind="stable").reset_index(drop=True)
    n = len(df)
    names = df["name"].to_numpy(object)
    ts = df["ts_ns"].to_numpy(np.int64)
    end = ts + df["dur_ns"].to_numpy(np.int64)
    own_step = _step_ordinals(names, ts, df["payload"])
    keys = list(zip(df["process"].to_numpy(np.int64).tolist(), df["thread"].to_numpy(np.int64).tolist()))
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    end_clip = end.copy()
    step = own_step.copy()
    paths: list[str] = [""] * n
    stack: list[int] = []
    current: tuple[int, int] | None = None
    for i in range(n):  # one pass; a Python loop over ranges (not kernels) is cheap
        if keys[i] != current:
            stack, current = [], keys[i]
        while stack and end_clip[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            p = stack[-1]
            parent[i], depth[i] = p, len(stack)
            end_clip[i] = min(end_clip[i], end_clip[p])
            paths[i] = f"{paths[p]}/{names[i]}"
            if step[p] != -1:  # the outermost "step" decides
                step[i] = step[p]
        else:
            paths[i] = str(names[i])
        stack.append(i)
    return df.assign(depth=depth, path=np.array(paths, dtype=object), step_id=step, parent=parent,
                     end_clip_ns=end_clip)


def enclosing_range(nested: pd.DataFrame, process: np.ndarray, thread: np.ndarray,
                    ts: np.ndarray) -> np.ndarray:
    """Row position in `nested` (from nest_ranges) of the innermost range open at each instant on
    the same (process, thread), or -1. A range covers [start, end): an instant at its end is
    outside it."""
    out = np.full(len(ts), -1, dtype=np.int64)
    if nested.empty or len(ts) == 0:
        return out
    r_ts = nested["ts_ns"].to_numpy(np.int64)
    r_end = nested["end_clip_ns"].to_numpy(np.int64)
    live = np.flatnonzero(r_end > r_ts)  # an empty range encloses nothing
    depth = nested["depth"].to_numpy(np.int64)[live]
    # Breakpoints: at a start the range itself becomes current; at an end its parent does.
    # Same instant: ends before starts, deeper ends first, shallower starts first.
    time = np.concatenate([r_ts[live], r_end[live]])
    value = np.concatenate([live, nested["parent"].to_numpy(np.int64)[live]])
    kind = np.concatenate([np.ones(len(live), np.int64), np.zeros(len(live), np.int64)])
    tie = np.concatenate([depth, -depth])
    r_proc = np.tile(nested["process"].to_numpy(np.int64)[live], 2)
    r_thr = np.tile(nested["thread"].to_numpy(np.int64)[live], 2)
    order = np.lexsort((tie, kind, time, r_thr, r_proc))
    time, value, r_proc, r_thr = time[order], value[order], r_proc[order], r_thr[order]
    q = pd.DataFrame({"process": np.asarray(process, np.int64), "thread": np.asarray(thread, np.int64)})
    bp = pd.DataFrame({"process": r_proc, "thread": r_thr})
    bp_groups = bp.groupby(["process", "thread"], sort=False).indices
    q_ts = np.asarray(ts, np.int64)
    for key, rows in q.groupby(["process", "thread"], sort=False).indices.items():
        span = bp_groups.get(key)
        if span is None:
            continue
        lo, hi = span[0], span[-1] + 1  # contiguous after the lexsort
        pos = np.searchsorted(time[lo:hi], q_ts[rows], side="right") - 1
        found = pos >= 0
        out[rows[found]] = value[lo:hi][pos[found]]
    return out
