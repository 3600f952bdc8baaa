"""Cost attribution: each step's engine time, and what a GPU measured over it (energy, SM
activity), split over the requests in its batch in proportion to the tokens each fed, then rolled
up per request and per task.

Engine time is a step's wall-clock duration on the engine's clock: the forward pass, sampling and
the host's own work together, on a CPU run as on a GPU. It is not GPU time. The GPU figures come
only from a GPU, through `measured` (step_id plus the integer columns of MEASURED, computed by
`correlate.energy` from the GPU's cumulative counters); without it they are NaN, never 0.

Inputs: `steps` (step_id, start_ns, end_ns, ...), `batch` (step_id, request_id, num_tokens).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: Per-step integer amounts a GPU measured: energy in microjoules, SM-active time in ns (summed over GPUs).
MEASURED = ("energy_uj", "gpu_sm_active_ns")
SHARE_COLUMNS = {"step_id": "int64", "request_id": "int64", "num_tokens": "int64", "share": "float64",
                 "engine_seconds": "float64", "energy_uj": "float64", "gpu_sm_active_ns": "float64"}
REQUEST_COST_COLUMNS = {"request_id": "int64", "engine_seconds": "float64", "energy_j": "float64",
                        "gpu_sm_active_s": "float64"}


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def _weights(batch: pd.DataFrame, weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(weight, denominator) per batch row: its weight (default: the tokens it fed) over its step's
    total; a step whose members all weigh 0 (not emitted by the engine today) is split evenly."""
    tokens = batch["num_tokens"].to_numpy(np.int64) if weight is None else np.asarray(weight, np.int64)
    group, order, starts = _groups(batch["step_id"].to_numpy(np.int64))
    total = np.add.reduceat(tokens[order], starts)[group] if len(tokens) else tokens
    weight = np.where(total > 0, tokens, 1)
    return weight, np.where(total > 0, total, np.diff(np.append(starts, len(tokens)))[group])


def _groups(step_id: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group of each row, rows ordered by group (stable), start of each group in that order): plain
    numpy for the per-step sums and ranks (pandas' groupby costs ms per call on every poll)."""
    if len(step_id) and bool(np.all(step_id[1:] >= step_id[:-1])):
        # Batch rows come step by step: groups in order already, so no hashing and no sort (the
        # same group numbers, first-seen order, as factorize gives).
        new = np.r_[True, step_id[1:] != step_id[:-1]]
        return np.cumsum(new) - 1, np.arange(len(step_id)), np.flatnonzero(new)
    group = pd.factorize(step_id)[0]
    order = np.argsort(group, kind="stable")
    starts = np.flatnonzero(np.r_[True, group[order][1:] != group[order][:-1]]) if len(group) else group
    return group, order, starts


def _largest_remainder(step_id: np.ndarray, weight: np.ndarray, denom: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """Each row's integer part of its step's `amount`, proportional to weight / denom. The floors
    leave `short` units per step; the `short` rows with the largest remainders get one more (ties:
    batch order), so a step's parts sum exactly to its amount."""
    base, rem = np.divmod(amount * weight, denom)
    if len(base) == 0:
        return base
    group, order, starts = _groups(step_id)
    short = amount - np.add.reduceat(base[order], starts)[group]
    # rank within the step by remainder, largest first, ties in batch order (rank(method="first"))
    by_rem = np.lexsort((np.arange(len(rem)), -rem, group))
    sizes = np.diff(np.append(starts, len(rem)))
    rank = np.empty(len(rem), np.int64)
    rank[by_rem] = np.arange(len(rem)) - np.repeat(starts, sizes) + 1
    return base + (rank <= short)


def split_by_tokens(batch: pd.DataFrame, per_step: pd.Series) -> np.ndarray:
    """Each batch row's part of its step's integer amount (`per_step`: indexed by step_id), by token
    share and largest remainder, so every step's parts sum exactly to its amount. float64 holding
    integers; NaN for rows whose step is absent from per_step or NaN there."""
    return split_in_proportion(batch, None, per_step)


def split_in_proportion(batch: pd.DataFrame, weight: np.ndarray | None, per_step: pd.Series) -> np.ndarray:
    """split_by_tokens with each row's int64 `weight` in place of its token count (None: tokens);
    e.g. correlate.token_cost.member_weights, a member's modelled share of its step's cost."""
    if batch.empty:
        return np.empty(0)
    step_id = batch["step_id"].to_numpy(np.int64)
    amount = per_step[~per_step.index.duplicated()].reindex(step_id).to_numpy(np.float64)
    known = ~np.isnan(amount)
    w, denom = _weights(batch, weight)
    parts = _largest_remainder(step_id, w, denom, np.where(known, amount, 0).astype(np.int64))
    return np.where(known, parts.astype(np.float64), np.nan)


def step_cost_shares(steps: pd.DataFrame, batch: pd.DataFrame, measured: pd.DataFrame | None = None
                     ) -> pd.DataFrame:
    """One row per batch member: step_id, request_id, num_tokens, share (num_tokens / the step's
    tokens; equal shares if the step fed none), engine_seconds (the step's end_ns - start_ns times
    share), and the MEASURED columns (the step's amount times share; NaN without `measured`, for
    steps it lacks, or where it holds NaN).

    Every amount is split in integers by largest remainder, so each step's members sum exactly to
    its duration in ns (round(engine_seconds * 1e9) recovers them) and to its measured amounts.
    Members of steps missing from `steps` (no duration known) are dropped. Rows keep batch order."""
    if batch.empty or steps.empty:
        return _empty(SHARE_COLUMNS)
    # Each step id's duration (its first record), looked up by binary search: no index is built.
    known, first = np.unique(steps["step_id"].to_numpy(np.int64), return_index=True)
    dur = np.clip(steps["end_ns"].to_numpy(np.int64)[first] - steps["start_ns"].to_numpy(np.int64)[first], 0, None)
    b_step = batch["step_id"].to_numpy(np.int64)
    at = np.minimum(np.searchsorted(known, b_step), len(known) - 1)
    has = known[at] == b_step
    df = batch[has][["step_id", "request_id", "num_tokens"]].reset_index(drop=True)
    if df.empty:
        return _empty(SHARE_COLUMNS)
    weight, denom = _weights(df)
    step_id = df["step_id"].to_numpy(np.int64)
    engine_ns = _largest_remainder(step_id, weight, denom, dur[at[has]])
    out = pd.DataFrame({"step_id": step_id, "request_id": df["request_id"].to_numpy(np.int64),
                        "num_tokens": df["num_tokens"].to_numpy(np.int64), "share": weight / denom,
                        "engine_seconds": engine_ns / 1e9})
    per_step = measured.drop_duplicates("step_id").set_index("step_id") if measured is not None else None
    for col in MEASURED:
        have = per_step is not None and col in per_step.columns
        out[col] = split_by_tokens(df, per_step[col]) if have else np.full(len(df), np.nan)
    # Built with these dtypes already: cast (a copy of every column) only if one is not.
    return out.astype(SHARE_COLUMNS) if any(out[c].dtype != t for c, t in SHARE_COLUMNS.items()) else out


def cost_by_request(shares: pd.DataFrame) -> pd.DataFrame:
    """Columns request_id, engine_seconds, energy_j, gpu_sm_active_s (sums over steps; a GPU
    column is NaN when none of the request's steps had it), sorted by request_id."""
    if shares.empty:
        return _empty(REQUEST_COST_COLUMNS)
    grouped = shares.groupby("request_id", sort=True)
    # sum(min_count=1): NaN only where no step had the measurement.
    return pd.DataFrame({"request_id": grouped["engine_seconds"].sum().index.to_numpy(np.int64),
                         "engine_seconds": grouped["engine_seconds"].sum().to_numpy(),
                         "energy_j": grouped["energy_uj"].sum(min_count=1).to_numpy() / 1e6,
                         "gpu_sm_active_s": grouped["gpu_sm_active_ns"].sum(min_count=1).to_numpy() / 1e9})


def cost_by_task(shares: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Columns task, engine_seconds, energy_j, gpu_sm_active_s, requests (distinct request_ids),
    sorted by task. The task of each request comes from `requests` (request_id, task; e.g.
    request_table()); requests absent from it, such as ones still running, count as "other"."""
    columns = {"task": "object", **{k: v for k, v in REQUEST_COST_COLUMNS.items() if k != "request_id"},
               "requests": "int64"}
    if shares.empty:
        return _empty(columns)
    tasks = requests.drop_duplicates("request_id").set_index("request_id")["task"]
    task = shares["request_id"].map(tasks).fillna("other").astype(object)
    out = shares.assign(task=task).groupby("task", as_index=False, sort=True).agg(
        engine_seconds=("engine_seconds", "sum"), energy_j=("energy_uj", lambda j: j.sum(min_count=1) / 1e6),
        gpu_sm_active_s=("gpu_sm_active_ns", lambda s: s.sum(min_count=1) / 1e9),
        requests=("request_id", "nunique"))
    return out.astype(columns)
