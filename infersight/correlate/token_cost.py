"""What each request costs a step, by the kind of tokens it fed: the weights that split a step's
measured energy (and SM activity) over its batch.

A step's wall-clock time is modelled, over the steps of the same run, as

    duration_ns  ~  intercept + prefill_ns * prefill_tokens + decode_ns * decode_tokens + spec_ns * spec_tokens

fitted by least squares with every coefficient >= 0 (`fit_token_costs`, on the running sums of
`normal_equations`). The intercept is fitted so that it does not inflate the per-token times; it is
what a step costs whoever is in it (launches, host work, weight reads), and it is spread over the
step's members with the rest, in proportion to their token cost (`member_weights` can also split
it equally, each member's Shapley share). A member's modelled cost, and so its weight, is

    prefill_ns * its prefill tokens + decode_ns * its decode tokens + spec_ns * its spec tokens

Which kind a member's tokens are is not in the batch rows (step_id, request_id, num_tokens):
`member_tokens` reads it from the step's totals and the request's PREFILL_CHUNK events (the engine
stamps a chunk with its step's start). A decode member feeds one decode token plus its draft
tokens (spec); a prefill member feeds its chunk. A step whose members cannot be told apart this
way (a chunk event lost, a mixed step without them) is marked unresolved: it is split by token share.

Frames:
  members  step_id, request_id, num_tokens, prefill, decode, spec (int64), resolved (bool, per step)
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

#: Regressors of the step-time model, in the order of `normal_equations` (after the intercept).
KINDS = ("prefill", "decode", "spec")
STEP_KIND_COLUMNS = {"prefill": "prefill_tokens", "decode": "decode_tokens", "spec": "spec_tokens"}
MEMBER_COLUMNS = {"step_id": "int64", "request_id": "int64", "num_tokens": "int64", "prefill": "int64",
                  "decode": "int64", "spec": "int64", "resolved": "bool"}
#: A fit over fewer steps than this is not used (the split falls back to token share).
MIN_FIT_STEPS = 8


@dataclass(frozen=True)
class TokenCosts:
    """A fitted step-time model (ns). steps: how many steps it was fitted on; usable: the fit had
    enough steps and every kind seen in them could be told apart (full rank)."""

    intercept_ns: float = 0.0
    prefill_ns: float = 0.0
    decode_ns: float = 0.0
    spec_ns: float = 0.0
    steps: int = 0
    usable: bool = False

    def describe(self) -> dict[str, object]:
        return {"intercept_ms": self.intercept_ns / 1e6, "prefill_us_per_token": self.prefill_ns / 1e3,
                "decode_us_per_token": self.decode_ns / 1e3, "spec_us_per_token": self.spec_ns / 1e3,
                "steps_fitted": self.steps, "usable": self.usable,
                "how": "least squares of each step's duration (engine clock) on its prefill, decode and draft "
                       "token counts plus an intercept, coefficients >= 0; a request's weight in a step is its "
                       "tokens times their kind's time per token"}


def normal_equations(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int]:
    """(X'X 4x4, X'y 4, steps used) of the steps that ran a batch: X = [1, prefill, decode, spec]
    tokens, y = end_ns - start_ns. Sums, so a run's fit is the sum over its polls."""
    s = steps[steps["batch_size"].to_numpy() > 0] if "batch_size" in steps.columns else steps
    x = np.column_stack([np.ones(len(s))] + [s[STEP_KIND_COLUMNS[k]].to_numpy(np.float64) for k in KINDS])
    y = (s["end_ns"].to_numpy(np.int64) - s["start_ns"].to_numpy(np.int64)).astype(np.float64)
    return x.T @ x, x.T @ y, len(s)


def fit_token_costs(xtx: np.ndarray, xty: np.ndarray, steps: int) -> TokenCosts:
    """The non-negative least-squares fit from the normal equations: among the columns that ever
    held a token, every subset is solved unconstrained and the best one whose coefficients are all
    >= 0 wins (with four columns that is exact NNLS). The intercept is always in the model."""
    seen = [0] + [i for i in range(1, 4) if xtx[i, i] > 0]
    sub = xtx[np.ix_(seen, seen)]
    usable = steps >= MIN_FIT_STEPS and np.linalg.matrix_rank(sub) == len(seen)
    best, best_obj = np.zeros(4), 0.0  # all zeros: objective 0 (of b'Gb - 2h'b)
    for r in range(1, len(seen) + 1):
        for cols in combinations(seen, r):
            g, h = xtx[np.ix_(cols, cols)], xty[list(cols)]
            if np.linalg.matrix_rank(g) < len(cols):
                continue
            b = np.linalg.solve(g, h)
            if np.any(b < 0):
                continue
            obj = float(b @ g @ b - 2 * h @ b)
            if obj < best_obj:
                best, best_obj = np.zeros(4), obj
                best[list(cols)] = b
    return TokenCosts(*map(float, best), steps=steps, usable=bool(usable))


def member_tokens(steps: pd.DataFrame, batch: pd.DataFrame, chunks: pd.DataFrame) -> pd.DataFrame:
    """members (module docstring): each batch row's tokens by kind. chunks: PREFILL_CHUNK events
    (request_id, ts_ns); a member is prefilling when one of its request's chunks starts inside its
    step's [start_ns, end_ns). A step is resolved when its members' kinds add up to its
    own prefill, decode and spec totals; every member of a pure step (one kind only) is resolved
    without chunks."""
    if batch.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in MEMBER_COLUMNS.items()})
    cols = ["step_id", "start_ns", "end_ns", *STEP_KIND_COLUMNS.values()]
    m = batch[["step_id", "request_id", "num_tokens"]].reset_index(drop=True)
    m = m.merge(steps[cols].drop_duplicates("step_id"), on="step_id", how="left", sort=False)
    n = m["num_tokens"].to_numpy(np.int64)
    prefilling = np.zeros(len(m), bool)
    if not chunks.empty:
        c = chunks[["request_id", "ts_ns"]].merge(m[["request_id", "step_id", "start_ns", "end_ns"]].reset_index(),
                                                  on="request_id")
        inside = (c["ts_ns"] >= c["start_ns"]) & (c["ts_ns"] < c["end_ns"])
        prefilling[c.loc[inside, "index"].to_numpy(np.int64)] = True
    p_tot, d_tot, s_tot = (m[c].fillna(0).to_numpy(np.int64) for c in STEP_KIND_COLUMNS.values())
    # A pure step needs no chunks: no decode and no spec tokens -> all prefill; no prefill -> all decode.
    prefilling = np.where((d_tot == 0) & (s_tot == 0), True, np.where(p_tot == 0, False, prefilling))
    prefill = np.where(prefilling, n, 0)
    decode = np.where(prefilling, 0, np.minimum(n, 1))
    spec = np.where(prefilling, 0, n - decode)
    out = pd.DataFrame({"step_id": m["step_id"].to_numpy(np.int64), "request_id": m["request_id"].to_numpy(np.int64),
                        "num_tokens": n, "prefill": prefill, "decode": decode, "spec": spec})
    sums = out.groupby("step_id", sort=False)[["prefill", "decode", "spec"]].transform("sum")
    ok = ((sums["prefill"].to_numpy() == p_tot) & (sums["decode"].to_numpy() == d_tot)
          & (sums["spec"].to_numpy() == s_tot))
    out["resolved"] = pd.Series(ok).groupby(out["step_id"].to_numpy()).transform("all").to_numpy(bool)
    return out.astype(MEMBER_COLUMNS)


#: Weights are fractions of their step in units of 2**-WEIGHT_BITS, so an integer split (amount x
#: weight) stays within int64 for steps of up to ~8 MJ (cost._largest_remainder).
WEIGHT_BITS = 20


def member_weights(members: pd.DataFrame, costs: TokenCosts, intercept: str = "proportional") -> np.ndarray:
    """int64 weight of each member within its step: its modelled cost (module docstring) as a
    fraction of the step's, in units of 2**-WEIGHT_BITS; a member of an unresolved step, of a step
    whose modelled cost is 0, or any member while `costs` is not usable, weighs its token count
    instead (token share).

    intercept: "proportional" (the agent's rule) spreads a step's fixed cost with its token cost;
    "equal" adds intercept / batch size to every member (each member's Shapley share of a cost that
    is paid once whoever is in the step). benchmarks/energy_split_check.py compares the two."""
    if intercept not in ("proportional", "equal"):
        raise ValueError(f"intercept is proportional or equal, got {intercept!r}")
    if members.empty:
        return np.empty(0, np.int64)
    step = members["step_id"].to_numpy(np.int64)
    cost = (costs.prefill_ns * members["prefill"].to_numpy(np.float64)
            + costs.decode_ns * members["decode"].to_numpy(np.float64)
            + costs.spec_ns * members["spec"].to_numpy(np.float64))
    if intercept == "equal":
        size = members.groupby("step_id", sort=False)["step_id"].transform("size").to_numpy(np.float64)
        cost = cost + costs.intercept_ns / size
    total = pd.Series(cost).groupby(step).transform("sum").to_numpy(np.float64)
    modelled = np.rint(np.divide(cost, total, out=np.zeros_like(cost), where=total > 0) * (1 << WEIGHT_BITS))
    by_model = members["resolved"].to_numpy(bool) & costs.usable & (total > 0)
    return np.where(by_model, modelled, members["num_tokens"].to_numpy(np.float64)).astype(np.int64)
