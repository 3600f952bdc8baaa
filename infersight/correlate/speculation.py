"""Speculative decoding: acceptance per task and per draft position.

Input is the `spec` frame (ts_ns, request_id, task, proposed, accepted, accept_mask, draft_ns,
verify_ns), one row per verification: `proposed` draft tokens (gamma) checked by one target
forward, `accepted` of them kept; bit i of accept_mask is set when draft position i was accepted.

With per-token acceptance alpha and gamma drafts, a verification yields on average
tau = (1 - alpha^(gamma+1)) / (1 - alpha) tokens (Leviathan et al., 2023). What that buys in
time is measured, not modelled: see spec_speedup (the speedup) and spec_advice (the advice).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

TASK_COLUMNS = {"task": "object", "verifications": "int64", "proposed": "int64", "accepted": "int64",
                "accept_rate": "float64", "mean_accepted_length": "float64", "gamma": "float64"}
POSITION_COLUMNS = {"task": "object", "position": "int64", "proposed": "int64", "accepted": "int64",
                    "accept_rate": "float64"}
#: accept_mask holds 64 bits; later positions are not observable.
MASK_BITS = 64


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def expected_tokens_per_step(alpha: float, gamma: float) -> float:
    """Tokens one verification yields on average: (1 - alpha^(gamma+1)) / (1 - alpha); gamma + 1 at
    alpha == 1 (the limit: every draft and the bonus token)."""
    if alpha == 1.0:
        return float(gamma + 1)
    return float((1.0 - alpha ** (gamma + 1)) / (1.0 - alpha))


def acceptance_by_task(spec: pd.DataFrame) -> pd.DataFrame:
    """One row per task, sorted by task: verifications, proposed, accepted (sums), accept_rate
    (alpha = accepted / proposed, NaN when nothing was proposed), mean_accepted_length (tau =
    mean of accepted + 1 over verifications, the tokens each yields, measured) and gamma (mean
    proposed)."""
    if spec.empty:
        return _empty(TASK_COLUMNS)
    agg = spec.assign(_tau=spec["accepted"] + 1).groupby("task", as_index=False, sort=True, observed=True).agg(
        verifications=("request_id", "size"), proposed=("proposed", "sum"), accepted=("accepted", "sum"),
        mean_accepted_length=("_tau", "mean"), gamma=("proposed", "mean"))
    proposed = agg["proposed"].to_numpy(np.float64)
    agg["accept_rate"] = np.divide(agg["accepted"].to_numpy(np.float64), proposed,
                                   out=np.full(len(agg), np.nan), where=proposed > 0)
    return agg[list(TASK_COLUMNS)].astype(TASK_COLUMNS)


def acceptance_by_position(spec: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, position) for positions 0 .. max proposed - 1 (at most 64): proposed
    (verifications with proposed > position), accepted (those with the position's accept_mask bit
    set), accept_rate. Since a draft is only checked after every earlier one was accepted, the
    rate at position i is the chance a draft survives to i: it never increases with i."""
    if spec.empty:
        return _empty(POSITION_COLUMNS)
    # Counts per (task, position) by bincount over the task codes, one pass per position rather
    # than a groupby (this runs on every poll's verifications).
    codes, names = pd.factorize(spec["task"], sort=True)
    keep = codes >= 0  # as groupby: rows without a task are left out
    codes = codes[keep]
    proposed = spec["proposed"].to_numpy(np.int64)[keep]
    mask = spec["accept_mask"].to_numpy(np.uint64)[keep]
    k = len(names)
    top = np.full(k, -1, np.int64)
    np.maximum.at(top, codes, proposed)
    positions = np.minimum(top, MASK_BITS)  # positions 0 .. max proposed - 1 per task
    n_pos = int(positions.max(initial=0))
    checked = np.zeros((k, n_pos), np.int64)
    kept = np.zeros((k, n_pos), np.int64)
    for pos in range(n_pos):
        live = proposed > pos
        checked[:, pos] = np.bincount(codes[live], minlength=k)
        kept[:, pos] = np.bincount(codes[live & (((mask >> np.uint64(pos)) & np.uint64(1)) == 1)], minlength=k)
    task_of = np.repeat(np.arange(k), np.maximum(positions, 0))
    pos_of = np.arange(len(task_of)) - np.repeat(np.cumsum(np.maximum(positions, 0)) - np.maximum(positions, 0),
                                                 np.maximum(positions, 0))
    n, acc = checked[task_of, pos_of].astype(np.int64), kept[task_of, pos_of].astype(np.int64)
    out = pd.DataFrame({"task": pd.Series(np.asarray(names, dtype=object)[task_of], dtype=object, copy=False),
                        "position": pos_of.astype(np.int64), "proposed": n, "accepted": acc, "accept_rate": acc / n})
    # Built with these dtypes: cast (a copy of every column) only if one is not.
    return out.astype(POSITION_COLUMNS) if any(out[c].dtype != t for c, t in POSITION_COLUMNS.items()) else out
