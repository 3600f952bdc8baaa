"""GPU samples as a DataFrame, and the step-level analyses over it (pure; inputs never mutated).

samples   ts_ns (monotonic ns, the engine's clock), gpu, uuid, field, value (base units),
          instance ("" for the whole GPU, else the MIG GPU-instance id)
steps     step_id, start_ns, end_ns, prefill_tokens, decode_tokens, ... (infersight.correlate.frames)

A sample belongs to every step whose closed window [start_ns, end_ns] contains its ts_ns, so a
sample on the boundary of two touching steps counts for both. The analyses use whole-GPU rows
only: a MIG instance's activity is a share of its slice, not of the GPU.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from infersight.gpu.fields import DRAM, TENSOR
from infersight.gpu.samples import GpuSample

SAMPLE_COLUMNS = {"ts_ns": "int64", "gpu": "int64", "uuid": "object", "field": "object", "value": "float64",
                  "instance": "object"}
STEP_AVERAGE_COLUMNS = {"step_id": "int64", "gpu": "int64", "field": "object", "mean": "float64"}
PHASE_COLUMNS = {"phase": "object", "field": "object", "mean": "float64"}
PHASES = ("prefill_heavy", "decode_heavy")


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def samples_frame(samples: Iterable[GpuSample]) -> pd.DataFrame:
    """One row per sample, in the order given."""
    rows = list(samples)
    if not rows:
        return _empty(SAMPLE_COLUMNS)
    return pd.DataFrame({
        "ts_ns": np.fromiter((s.ts_ns for s in rows), np.int64, len(rows)),
        "gpu": np.fromiter((s.gpu for s in rows), np.int64, len(rows)),
        "uuid": pd.Series([s.uuid for s in rows], dtype=object),
        "field": pd.Series([s.field for s in rows], dtype=object),
        "value": np.fromiter((s.value for s in rows), np.float64, len(rows)),
        "instance": pd.Series([s.instance for s in rows], dtype=object)})


def _whole_gpu(samples_df: pd.DataFrame) -> pd.DataFrame:
    if "instance" in samples_df.columns:
        return samples_df[samples_df["instance"].fillna("") == ""]
    return samples_df


def _in_steps(samples_df: pd.DataFrame, steps_df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(sample row positions, step row positions): every (sample, step) pair with the sample's
    ts_ns inside the step's window. Sorts the samples once; each step is two binary searches."""
    order = np.argsort(samples_df["ts_ns"].to_numpy(np.int64), kind="stable")
    ts = samples_df["ts_ns"].to_numpy(np.int64)[order]
    lo = np.searchsorted(ts, steps_df["start_ns"].to_numpy(np.int64), side="left")
    hi = np.searchsorted(ts, steps_df["end_ns"].to_numpy(np.int64), side="right")
    counts = np.maximum(hi - lo, 0)
    step_pos = np.repeat(np.arange(len(steps_df)), counts)
    # Offsets within each step's run of samples: 0..count-1, laid end to end.
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return order[np.repeat(lo, counts) + within], step_pos


def step_averages(samples_df: pd.DataFrame, steps_df: pd.DataFrame) -> pd.DataFrame:
    """step_id, gpu, field, mean: the mean value of each field's whole-GPU samples inside each
    step. Steps without samples have no rows (GPU polling is coarser than short steps).
    Sorted by step_id, gpu, field."""
    samples_df = _whole_gpu(samples_df)
    if samples_df.empty or steps_df.empty:
        return _empty(STEP_AVERAGE_COLUMNS)
    sample_pos, step_pos = _in_steps(samples_df, steps_df)
    if len(sample_pos) == 0:
        return _empty(STEP_AVERAGE_COLUMNS)
    joined = pd.DataFrame({"step_id": steps_df["step_id"].to_numpy(np.int64)[step_pos],
                           "gpu": samples_df["gpu"].to_numpy(np.int64)[sample_pos],
                           "field": samples_df["field"].to_numpy(object)[sample_pos],
                           "value": samples_df["value"].to_numpy(np.float64)[sample_pos]})
    out = joined.groupby(["step_id", "gpu", "field"], sort=True)["value"].mean().reset_index(name="mean")
    return out.astype(STEP_AVERAGE_COLUMNS)


def phase_breakdown(samples_df: pd.DataFrame, steps_df: pd.DataFrame,
                    fields: tuple[str, ...] = (TENSOR, DRAM)) -> pd.DataFrame:
    """phase, field, mean: tensor and DRAM activity of prefill-heavy steps (prefill_tokens >
    decode_tokens) against decode-heavy steps (the rest). The mean pools every whole-GPU sample
    inside steps of that phase, over all GPUs, so long steps weigh by their sample count.
    Rows for (phase, field) pairs without samples are omitted; phases in PHASES order."""
    samples_df = _whole_gpu(samples_df)
    samples_df = samples_df[samples_df["field"].isin(fields)]
    if samples_df.empty or steps_df.empty:
        return _empty(PHASE_COLUMNS)
    sample_pos, step_pos = _in_steps(samples_df, steps_df)
    if len(sample_pos) == 0:
        return _empty(PHASE_COLUMNS)
    prefill_heavy = (steps_df["prefill_tokens"].to_numpy(np.int64) > steps_df["decode_tokens"].to_numpy(np.int64))
    joined = pd.DataFrame({"phase": np.where(prefill_heavy[step_pos], PHASES[0], PHASES[1]).astype(object),
                           "field": samples_df["field"].to_numpy(object)[sample_pos],
                           "value": samples_df["value"].to_numpy(np.float64)[sample_pos]})
    out = joined.groupby(["phase", "field"], sort=False)["value"].mean().reset_index(name="mean")
    rank = {p: i for i, p in enumerate(PHASES)} | {f: i for i, f in enumerate(fields)}
    out = out.sort_values(["phase", "field"], key=lambda col: col.map(rank)).reset_index(drop=True)
    return out.astype(PHASE_COLUMNS)


def covering_samples(samples: Iterable[GpuSample], start_ns: int, end_ns: int, max_lag_ns: int) -> dict[str, float]:
    """field -> value of the first whole-GPU sample of each field taken at or after `end_ns` (within
    `max_lag_ns`), averaged over GPUs. Sampled values (GPM, utilisation) average the window that
    ends at their timestamp, so this is the reading that covers a step shorter than the interval."""
    first: dict[tuple[str, int], tuple[int, float]] = {}
    for s in samples:
        if s.instance or not end_ns <= s.ts_ns <= end_ns + max_lag_ns:
            continue
        key = (s.field, s.gpu)
        if key not in first or s.ts_ns < first[key][0]:
            first[key] = (s.ts_ns, s.value)
    by_field: dict[str, list[float]] = {}
    for (field, _), (_, value) in first.items():
        by_field.setdefault(field, []).append(value)
    return {field: sum(v) / len(v) for field, v in by_field.items()}
