"""Speculative decoding: acceptance per task and per draft position, the speedup it predicts, and
simple tuning advice.

Input is the `spec` frame (ts_ns, request_id, task, proposed, accepted, accept_mask, draft_ns,
verify_ns), one row per verification: `proposed` draft tokens (gamma) checked by one target
forward, `accepted` of them kept; bit i of accept_mask is set when draft position i was accepted.
draft_ns is the step's drafting phase (all gamma sequential draft forwards), verify_ns its target
forward; both are shared by every request verified in that step.

Model (Leviathan et al., 2023): with per-token acceptance alpha and gamma drafts, a verification
yields tau = (1 - alpha^(gamma+1)) / (1 - alpha) tokens on average and costs gamma * c + 1 target
forwards, c being one draft forward's cost relative to one target forward; speedup S = tau / (gamma c + 1).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

TASK_COLUMNS = {"task": "object", "verifications": "int64", "proposed": "int64", "accepted": "int64",
                "accept_rate": "float64", "mean_accepted_length": "float64", "gamma": "float64",
                "cost_ratio": "float64", "predicted_speedup": "float64"}
POSITION_COLUMNS = {"task": "object", "position": "int64", "proposed": "int64", "accepted": "int64",
                    "accept_rate": "float64"}
#: accept_mask holds 64 bits; later positions are not observable.
MASK_BITS = 64
HIGH_ACCEPT_RATE = 0.8
LOW_LAST_POSITION_RATE = 0.25


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
    (alpha = accepted / proposed), mean_accepted_length (tau = mean of accepted + 1 over
    verifications, the tokens each yields, measured), gamma (mean proposed), cost_ratio and
    predicted_speedup (S = tau / (gamma * cost_ratio + 1)).

    cost_ratio is c per draft token: sum draft_ns / sum (proposed * verify_ns). draft_ns covers all
    gamma draft forwards of a step, so gamma * c (not c) is the drafting phase relative to the
    target forward, as the model above needs. NaN when proposed or verify time is 0."""
    if spec.empty:
        return _empty(TASK_COLUMNS)
    df = spec.assign(_tau=spec["accepted"] + 1, _pv=spec["proposed"] * spec["verify_ns"])
    agg = df.groupby("task", as_index=False, sort=True).agg(
        verifications=("request_id", "size"), proposed=("proposed", "sum"), accepted=("accepted", "sum"),
        mean_accepted_length=("_tau", "mean"), gamma=("proposed", "mean"), draft_ns=("draft_ns", "sum"),
        pv=("_pv", "sum"))
    proposed = agg["proposed"].to_numpy(np.float64)
    pv = agg["pv"].to_numpy(np.float64)
    agg["accept_rate"] = np.divide(agg["accepted"].to_numpy(np.float64), proposed,
                                   out=np.full(len(agg), np.nan), where=proposed > 0)
    agg["cost_ratio"] = np.divide(agg["draft_ns"].to_numpy(np.float64), pv,
                                  out=np.full(len(agg), np.nan), where=pv > 0)
    agg["predicted_speedup"] = agg["mean_accepted_length"] / (agg["gamma"] * agg["cost_ratio"] + 1.0)
    return agg[list(TASK_COLUMNS)].astype(TASK_COLUMNS)


def acceptance_by_position(spec: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, position) for positions 0 .. max proposed - 1 (at most 64): proposed
    (verifications with proposed > position), accepted (those with the position's accept_mask bit
    set), accept_rate. Since a draft is only checked after every earlier one was accepted, the
    rate at position i is the chance a draft survives to i: it never increases with i."""
    if spec.empty:
        return _empty(POSITION_COLUMNS)
    rows = []
    for task, grp in spec.groupby("task", sort=True):
        proposed = grp["proposed"].to_numpy(np.int64)
        mask = grp["accept_mask"].to_numpy(np.uint64)
        for pos in range(min(int(proposed.max()), MASK_BITS)):
            n = int((proposed > pos).sum())
            k = int((((mask >> np.uint64(pos)) & np.uint64(1)) == 1)[proposed > pos].sum())
            rows.append((task, pos, n, k, k / n))
    return pd.DataFrame(rows, columns=list(POSITION_COLUMNS)).astype(POSITION_COLUMNS)


def recommendations(by_task: pd.DataFrame, by_position: pd.DataFrame | None = None) -> list[dict[str, str]]:
    """Advice per task from acceptance_by_task (and acceptance_by_position), dicts with task,
    action, reason; at most one per task, first rule that holds:

      disable_speculation  predicted_speedup < 1: drafting costs more than the tokens it saves
      increase_gamma       accept_rate >= 0.8 and predicted_speedup > 1: drafts are rarely wrong,
                           longer drafts would yield more tokens per target forward
      decrease_gamma       the last drafted position (highest with proposed > 0) survives in
                           < 25% of verifications: its draft forward is mostly wasted
    Tasks with NaN speedup (no verify time recorded) get no advice."""
    last_rate: dict[str, tuple[int, float]] = {}
    if by_position is not None and not by_position.empty:
        seen = by_position[by_position["proposed"] > 0].sort_values("position")
        for task, grp in seen.groupby("task"):
            last_rate[str(task)] = (int(grp["position"].iloc[-1]), float(grp["accept_rate"].iloc[-1]))
    out = []
    for row in by_task.itertuples(index=False):
        task, s, alpha = str(row.task), float(row.predicted_speedup), float(row.accept_rate)
        if np.isnan(s):
            continue
        if s < 1.0:
            out.append({"task": task, "action": "disable_speculation",
                        "reason": f"predicted speedup {s:.2f} < 1 (accept rate {alpha:.2f}, "
                                  f"gamma {row.gamma:.1f}, draft cost ratio {row.cost_ratio:.3f})"})
        elif alpha >= HIGH_ACCEPT_RATE and s > 1.0:
            out.append({"task": task, "action": "increase_gamma",
                        "reason": f"accept rate {alpha:.2f} >= {HIGH_ACCEPT_RATE} with predicted speedup "
                                  f"{s:.2f} at gamma {row.gamma:.1f}"})
        elif task in last_rate and last_rate[task][1] < LOW_LAST_POSITION_RATE:
            pos, rate = last_rate[task]
            out.append({"task": task, "action": "decrease_gamma",
                        "reason": f"draft position {pos} is accepted in only {rate:.0%} of verifications "
                                  f"(< {LOW_LAST_POSITION_RATE:.0%})"})
    return out
