"""A GPU's cumulative counters over engine step windows: energy per step, and what lies between.

counter   ts_ns, gpu, value: cumulative readings in integer units (microjoules for energy; ns for
          the SM-active integral of `integrate_gauge`), monotonic ns on the engine's clock
steps     step_id, start_ns, end_ns (infersight.correlate.frames)

The counter is read at the sampler's interval, not at every step, so its value at a step
boundary is interpolated: per GPU, linearly between the two readings around the boundary, after
making the GPU's readings non-decreasing (a running maximum: a cumulative counter never goes
back, so a reading that does is a glitch). Before a GPU's first reading its first value holds,
after its last reading its last value. The GPUs' values are summed and rounded to an integer once
per boundary. Every step and every gap between steps is then a difference of these same integers,
so the parts telescope:

    sum(step values) + idle == counter(to_ns) - counter(from_ns)        exactly, in integers

Windows are made disjoint before they are measured: a step that starts before the previous one
ended (several engines on one agent) starts where that one ended, so nothing is counted twice.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COUNTER_COLUMNS = {"ts_ns": "int64", "gpu": "int64", "value": "int64"}
STEP_VALUE_COLUMNS = {"step_id": "int64", "start_ns": "int64", "end_ns": "int64", "value": "int64"}


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def _interpolate(ts: np.ndarray, value: np.ndarray, at: np.ndarray) -> np.ndarray:
    """One GPU: float64 counter values at `at` (ts sorted ascending, value non-decreasing). Times
    are taken relative to the first reading, so ns since boot keep their precision in float64."""
    right = np.clip(np.searchsorted(ts, at, side="right"), 1, max(len(ts) - 1, 1))
    left = right - 1
    if len(ts) == 1:
        return np.full(len(at), float(value[0]))
    t0, t1 = ts[left], ts[right]
    v0, v1 = value[left], value[right]
    frac = np.clip((at - t0).astype(np.float64) / np.maximum(t1 - t0, 1), 0.0, 1.0)
    return v0.astype(np.float64) + (v1 - v0).astype(np.float64) * frac


def counter_at(counter: pd.DataFrame, at_ns: np.ndarray) -> np.ndarray:
    """The counter summed over GPUs at each time of at_ns, interpolated as the module says, as int64.
    Zeros when the counter is empty. Readings of one GPU at the same ts_ns: the last one counts."""
    at = np.asarray(at_ns, dtype=np.int64)
    # Integer origins and float increments apart: a counter since the driver loaded can pass 2**53 uJ.
    origins, increments = 0, np.zeros(len(at), dtype=np.float64)
    for _, g in counter.groupby("gpu", sort=True):
        g = g.sort_values("ts_ns", kind="stable").drop_duplicates("ts_ns", keep="last")
        ts = g["ts_ns"].to_numpy(np.int64)
        value = np.maximum.accumulate(g["value"].to_numpy(np.int64))
        origin_ts, origin_v = ts[0], value[0]
        origins += int(origin_v)
        increments += _interpolate(ts - origin_ts, value - origin_v, at - origin_ts)
    return origins + np.rint(increments).astype(np.int64)


def disjoint_windows(steps: pd.DataFrame, from_ns: int, to_ns: int) -> pd.DataFrame:
    """step_id, start_ns, end_ns: the steps ordered by start (then step_id), clipped to [from_ns,
    to_ns], each starting no earlier than every earlier step ended. Zero-length windows are kept."""
    if steps.empty:
        return _empty({k: v for k, v in STEP_VALUE_COLUMNS.items() if k != "value"})
    s = steps.sort_values(["start_ns", "step_id"], kind="stable")
    start = np.clip(s["start_ns"].to_numpy(np.int64), from_ns, to_ns)
    end = np.clip(s["end_ns"].to_numpy(np.int64), from_ns, to_ns)
    reach = np.maximum.accumulate(np.maximum(start, end))  # how far the windows so far extend
    start = np.maximum(start, np.concatenate(([from_ns], reach[:-1])))
    return pd.DataFrame({"step_id": s["step_id"].to_numpy(np.int64), "start_ns": start,
                         "end_ns": np.maximum(end, start)})


def step_values(steps: pd.DataFrame, counter: pd.DataFrame, from_ns: int, to_ns: int) -> tuple[pd.DataFrame, int]:
    """(per-step frame step_id, start_ns, end_ns, value; the idle value) over [from_ns, to_ns].

    value: counter(end) - counter(start) over each step's disjoint window; idle: the rest of
    counter(to_ns) - counter(from_ns), i.e. what accrued while no step ran. Both exact integers,
    and they add up exactly (module docstring)."""
    windows = disjoint_windows(steps, from_ns, to_ns)
    at = np.concatenate(([from_ns, to_ns], windows["start_ns"].to_numpy(np.int64),
                         windows["end_ns"].to_numpy(np.int64)))
    values = counter_at(counter, at)
    n = len(windows)
    per_step = values[2 + n:] - values[2:2 + n]
    idle = int(values[1] - values[0] - per_step.sum())
    return windows.assign(value=per_step).astype(STEP_VALUE_COLUMNS), idle


def integrate_gauge(samples: pd.DataFrame, scale: float = 1.0,
                    origin: dict[int, tuple[int, int]] | None = None) -> pd.DataFrame:
    """A counter (COUNTER_COLUMNS) from readings of a gauge that averages the window ending at its
    timestamp (GPM's SM activity, say): value_k = value_{k-1} + round(gauge_k * scale * (ts_k - ts_{k-1})).

    samples: ts_ns, gpu, value (float). origin: per GPU, the (ts_ns, value) the counter stood at
    before these samples (the last row of an earlier call); without one, a GPU's first reading
    starts its counter at 0 (the window it averaged began at an unknown time)."""
    rows = []
    for gpu, g in samples.sort_values("ts_ns", kind="stable").groupby("gpu", sort=True):
        ts = g["ts_ns"].to_numpy(np.int64)
        gauge = g["value"].to_numpy(np.float64)
        start = (origin or {}).get(int(gpu))
        if start is None:
            prev_ts, base = np.concatenate(([ts[0]], ts[:-1])), 0
        else:
            keep = ts > start[0]
            ts, gauge = ts[keep], gauge[keep]
            prev_ts, base = np.concatenate(([start[0]], ts[:-1])), start[1]
        increments = np.rint(np.maximum(gauge, 0.0) * scale * (ts - prev_ts)).astype(np.int64)
        rows.append(pd.DataFrame({"ts_ns": ts, "gpu": int(gpu), "value": base + np.cumsum(increments)}))
    return pd.concat(rows, ignore_index=True).astype(COUNTER_COLUMNS) if rows else _empty(COUNTER_COLUMNS)
