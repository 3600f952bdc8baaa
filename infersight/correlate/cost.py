"""Cost attribution: each step's GPU time (and energy) split over the requests in its batch, in
proportion to the tokens each fed, then rolled up per request and per task.

Inputs: `steps` (step_id, start_ns, end_ns, ...), `batch` (step_id, request_id, num_tokens) and
optionally `energy` (step_id, joules) from a power sampler.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

SHARE_COLUMNS = {"step_id": "int64", "request_id": "int64", "num_tokens": "int64", "share": "float64",
                 "gpu_seconds": "float64", "joules": "float64"}


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def step_cost_shares(steps: pd.DataFrame, batch: pd.DataFrame, energy: pd.DataFrame | None = None
                     ) -> pd.DataFrame:
    """One row per batch member: step_id, request_id, num_tokens, share (num_tokens / the step's
    tokens; equal shares if the step fed none), gpu_seconds (the step's end_ns - start_ns times
    share), joules (the step's joules times share; NaN without `energy` or for steps it lacks).

    gpu time is apportioned in integer ns by largest remainder, so each step's members' ns sum
    exactly to its duration (round(gpu_seconds * 1e9) recovers them). Members of steps missing
    from `steps` (no duration known) are dropped. Rows keep batch order."""
    if batch.empty or steps.empty:
        return _empty(SHARE_COLUMNS)
    dur = steps.drop_duplicates("step_id").set_index("step_id")
    dur = (dur["end_ns"].astype(np.int64) - dur["start_ns"].astype(np.int64)).clip(lower=0)
    df = batch[batch["step_id"].isin(dur.index)][["step_id", "request_id", "num_tokens"]].reset_index(drop=True)
    if df.empty:
        return _empty(SHARE_COLUMNS)
    tokens = df["num_tokens"].to_numpy(np.int64)
    by_step = df.groupby("step_id", sort=False)
    total = by_step["num_tokens"].transform("sum").to_numpy(np.int64)
    # A step whose members fed no tokens (not emitted by the engine today) is split evenly.
    weight = np.where(total > 0, tokens, 1)
    denom = np.where(total > 0, total, by_step["num_tokens"].transform("size").to_numpy(np.int64))
    step_ns = dur.reindex(df["step_id"]).to_numpy(np.int64)

    base, rem = np.divmod(step_ns * weight, denom)
    short = step_ns - pd.Series(base).groupby(df["step_id"]).transform("sum").to_numpy(np.int64)
    # The `short` members with the largest remainders get one more ns (ties: batch order).
    rank = pd.Series(-rem).groupby(df["step_id"]).rank(method="first").to_numpy(np.int64)
    gpu_ns = base + (rank <= short)

    share = weight / denom
    joules = np.full(len(df), np.nan)
    if energy is not None and not energy.empty:
        per_step = energy.groupby("step_id")["joules"].sum()
        joules = per_step.reindex(df["step_id"]).to_numpy(np.float64) * share
    return pd.DataFrame({"step_id": df["step_id"].to_numpy(np.int64), "request_id": df["request_id"].to_numpy(np.int64),
                         "num_tokens": tokens, "share": share, "gpu_seconds": gpu_ns / 1e9,
                         "joules": joules}).astype(SHARE_COLUMNS)


def cost_by_request(shares: pd.DataFrame) -> pd.DataFrame:
    """Columns request_id, gpu_seconds, joules (sums over steps; joules NaN when every one of the
    request's steps lacked energy data), sorted by request_id."""
    if shares.empty:
        return _empty({"request_id": "int64", "gpu_seconds": "float64", "joules": "float64"})
    grouped = shares.groupby("request_id", sort=True)
    # sum(min_count=1) through the vectorised path: NaN only where no step had energy data.
    return pd.DataFrame({"request_id": grouped["gpu_seconds"].sum().index.to_numpy(np.int64),
                         "gpu_seconds": grouped["gpu_seconds"].sum().to_numpy(),
                         "joules": grouped["joules"].sum(min_count=1).to_numpy()})


def cost_by_task(shares: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Columns task, gpu_seconds, joules, requests (distinct request_ids), sorted by task. The task of
    each request comes from `requests` (request_id, task; e.g. request_table()); requests absent
    from it, such as ones still running, count as "other"."""
    if shares.empty:
        return _empty({"task": "object", "gpu_seconds": "float64", "joules": "float64", "requests": "int64"})
    tasks = requests.drop_duplicates("request_id").set_index("request_id")["task"]
    task = shares["request_id"].map(tasks).fillna("other").astype(object)
    out = shares.assign(task=task).groupby("task", as_index=False, sort=True).agg(
        gpu_seconds=("gpu_seconds", "sum"), joules=("joules", lambda j: j.sum(min_count=1)),
        requests=("request_id", "nunique"))
    return out.astype({"task": "object", "requests": "int64"})
