"""What each request costs a step, by the kind of tokens it fed: the weights that split a step's
measured energy (and SM activity) over its batch.

The energy of each kind of token is fitted on the run's own measured energy. Over each interval
between two readings of the GPU's energy counter, the energy of the steps in it (the counter,
interpolated at the steps' ends, summed over the interval's steps) is modelled as

    energy_uj  ~  prefill_uj * prefill_tokens + decode_uj * decode_tokens + spec_uj * spec_tokens

by least squares with every coefficient >= 0 (`fit_token_costs`, on the running sums of
`normal_equations` over `interval_rows`). Why these choices:
- intervals, not steps: inside one interval the counter is interpolated linearly, so one step's
  energy is only its share of the interval's time; the sum over a whole interval is what was measured.
- energy, not step time: on a GPU a long prompt's step is largely host work (block hashing,
  scheduling) that draws little power. A fit on step time put 330 us on an H200 prefill token against
  128 us on a decode token, and gave long outputs 42% less than they cost alone (BENCHMARKS.md).
- no intercept: what a step costs whoever is in it (static power, weight reads) is carried by the
  per-token figures, as it is in what a class of requests costs when it runs alone.

A member's modelled cost, and so its weight in its step, is

    prefill_uj * its prefill tokens + decode_uj * its decode tokens + spec_uj * its spec tokens

Which kind a member's tokens are is not in the batch rows (step_id, request_id, num_tokens):
`member_tokens` reads it from the step's totals and the request's PREFILL_CHUNK events (the engine
stamps a chunk with its step's start). A decode member feeds one decode token plus its draft
tokens (spec); a prefill member feeds its chunk. A step whose members cannot be told apart this
way (a chunk event lost, a mixed step without them) is marked unresolved: it is split by token share.

Frames:
  measured  step_id, start_ns, end_ns, energy_uj (float64: the step's interpolated energy),
            prefill_tokens, decode_tokens, spec_tokens
  rows      end_ns (the reading that closes the interval), energy_uj, prefill_tokens, decode_tokens,
            spec_tokens (float64 sums over the interval's steps)
  members   step_id, request_id, num_tokens, prefill, decode, spec (int64), resolved (bool, per step)
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

#: Regressors of the energy model, in the order of `normal_equations`.
KINDS = ("prefill", "decode", "spec")
STEP_KIND_COLUMNS = {"prefill": "prefill_tokens", "decode": "decode_tokens", "spec": "spec_tokens"}
MEMBER_COLUMNS = {"step_id": "int64", "request_id": "int64", "num_tokens": "int64", "prefill": "int64",
                  "decode": "int64", "spec": "int64", "resolved": "bool"}
ROW_COLUMNS = ("end_ns", "energy_uj", *STEP_KIND_COLUMNS.values())
#: A fit is used once it has at least this many intervals per kind it has seen (an overdetermined
#: system: one noisy interval cannot set a coefficient alone), and MIN_FIT_INTERVALS in all; until
#: then token share.
MIN_INTERVALS_PER_KIND = 2
MIN_FIT_INTERVALS = 4


@dataclass(frozen=True)
class TokenCosts:
    """A fitted energy model (uJ per token). intervals: how many counter intervals it was fitted on;
    usable: enough intervals, and every kind seen in them could be told apart (full rank)."""

    prefill_uj: float = 0.0
    decode_uj: float = 0.0
    spec_uj: float = 0.0
    intervals: int = 0
    usable: bool = False

    def describe(self) -> dict[str, object]:
        return {"prefill_mj_per_token": self.prefill_uj / 1e3, "decode_mj_per_token": self.decode_uj / 1e3,
                "spec_mj_per_token": self.spec_uj / 1e3, "intervals_fitted": self.intervals, "usable": self.usable,
                "how": "least squares of the measured energy of the steps in each interval between two counter "
                       "readings on their prefill, decode and draft token counts, coefficients >= 0, no intercept; "
                       "a request's weight in a step is its tokens times their kind's joules per token"}


def interval_rows(measured: pd.DataFrame, readings_ns: np.ndarray) -> pd.DataFrame:
    """rows (module docstring): the measured steps summed per counter interval, a step counted in the
    interval its midpoint lies in (its key: the first reading after the midpoint). readings_ns: the
    counter's reading times, sorted; a step after the last reading is keyed by the last."""
    if measured.empty or len(readings_ns) == 0:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c == "end_ns" else "float64") for c in ROW_COLUMNS})
    mid = (measured["start_ns"].to_numpy(np.int64) + measured["end_ns"].to_numpy(np.int64)) // 2
    at = np.minimum(np.searchsorted(readings_ns, mid, side="right"), len(readings_ns) - 1)
    rows = measured[["energy_uj", *STEP_KIND_COLUMNS.values()]].astype(np.float64).assign(
        end_ns=np.asarray(readings_ns, np.int64)[at])
    return rows.groupby("end_ns", sort=True, as_index=False).sum()[list(ROW_COLUMNS)]


def normal_equations(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int]:
    """(X'X 3x3, X'y 3, rows used) of complete intervals: X = [prefill, decode, spec] tokens,
    y = energy_uj. Sums, so a run's fit is the sum over its polls."""
    x = rows[list(STEP_KIND_COLUMNS.values())].to_numpy(np.float64)
    y = rows["energy_uj"].to_numpy(np.float64)
    return x.T @ x, x.T @ y, len(rows)


def fit_token_costs(xtx: np.ndarray, xty: np.ndarray, intervals: int) -> TokenCosts:
    """The non-negative least-squares fit from the normal equations: among the kinds that ever held
    a token, every subset is solved unconstrained and the best one whose coefficients are all >= 0
    wins (with three columns that is exact NNLS)."""
    seen = [i for i in range(len(KINDS)) if xtx[i, i] > 0]
    if not seen:
        return TokenCosts(intervals=intervals)
    usable = (intervals >= max(MIN_FIT_INTERVALS, MIN_INTERVALS_PER_KIND * len(seen))
              and np.linalg.matrix_rank(xtx[np.ix_(seen, seen)]) == len(seen))
    best, best_obj = np.zeros(len(KINDS)), 0.0  # all zeros: objective 0 (of b'Gb - 2h'b)
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
                best, best_obj = np.zeros(len(KINDS)), obj
                best[list(cols)] = b
    return TokenCosts(*map(float, best), intervals=intervals, usable=bool(usable))


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


def member_weights(members: pd.DataFrame, costs: TokenCosts) -> np.ndarray:
    """int64 weight of each member within its step: its modelled cost (module docstring) as a
    fraction of the step's, in units of 2**-WEIGHT_BITS; a member of an unresolved step, of a step
    whose modelled cost is 0, or any member while `costs` is not usable, weighs its token count
    instead (token share)."""
    if members.empty:
        return np.empty(0, np.int64)
    step = members["step_id"].to_numpy(np.int64)
    cost = (costs.prefill_uj * members["prefill"].to_numpy(np.float64)
            + costs.decode_uj * members["decode"].to_numpy(np.float64)
            + costs.spec_uj * members["spec"].to_numpy(np.float64))
    total = pd.Series(cost).groupby(step).transform("sum").to_numpy(np.float64)
    modelled = np.rint(np.divide(cost, total, out=np.zeros_like(cost), where=total > 0) * (1 << WEIGHT_BITS))
    by_model = members["resolved"].to_numpy(bool) & costs.usable & (total > 0)
    return np.where(by_model, modelled, members["num_tokens"].to_numpy(np.float64)).astype(np.int64)
