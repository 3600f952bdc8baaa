"""What each request costs a step, by the kind of tokens it fed: the weights that split a step's
measured energy (and SM activity) over its batch, and the part of a step's energy that is static.

The energy of each kind of token, and the GPU's static power, are fitted on the run's own measured
energy. Over each interval between two readings of the GPU's energy counter, the energy of the steps
in it (the counter, interpolated at the steps' ends, summed over the interval's steps) is modelled as

    energy_uj  ~  static_uw * busy_s
                  + prefill_uj * prefill_tokens + decode_uj * decode_tokens + spec_uj * spec_tokens

(busy_s: the summed duration of the interval's steps) by least squares with every coefficient >= 0
(`fit_token_costs`, on the running sums of `normal_equations` over `interval_rows`). Why these choices:
- intervals, not steps: inside one interval the counter is interpolated linearly, so one step's
  energy is only its share of the interval's time; the sum over a whole interval is what was measured.
- energy, not step time: on a GPU a long prompt's step is largely host work (block hashing,
  scheduling) that draws little power. A fit on step time put 330 us on an H200 prefill token against
  128 us on a decode token, and gave long outputs 42% less than they cost alone (BENCHMARKS.md).
- a static term, per second of step time, not per interval: a GPU draws its static power (on an H200
  ~100 W of the 140-270 W it drew under load, BENCHMARKS.md) whether or not a token is fed, for as
  long as the steps take. Without it the fit folded static power into joules per token, and a
  class's joules alone then depended on how fast its phase ran (not a property of the request:
  no split could match it). With it, joules per token are the DYNAMIC cost of a token.
- no other intercept: the static term is the part of a step that does not scale with its tokens.
- the static term held at the GPU's measured idle power once the agent has read some (agent.energy_meter:
  settled idle, no step running): "dynamic" then means the energy above idle, the definition a known
  answer measured from the counter uses (a class's counter rise less idle power x its seconds). A free
  static term is the least-determined coefficient of the fit: on the H200 it came out 117-157 W
  against 124-126 W idle between runs, and every watt too many moved ~30 J a phase from the requests'
  dynamic energy to static (BENCHMARKS.md). Fitted when no idle has been read (a GPU never idle).

A step's measured energy E (its interpolated window) is then cut in two by the model
(`step_dynamic_share`): dynamic = E * D / (D + S), static = E - dynamic, where D is the step's
modelled token cost and S = static_uw * its duration; with the static power held at the measured
idle power, static = min(E, S) and dynamic = E - static (the energy above idle). Both parts are split over the step's members
by the same weights (below): the static part in proportion to the members' dynamic cost, because a
step lasts, and so draws static power, about as long as its work takes (a 512-token prefill chunk
keeps the GPU on far longer than one decode token beside it), so the requests whose work set the
step's length bear its static energy; an even split by time in the batch would charge each decode
token in a prefill step as much static energy as the prefill that made the step long.

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
  rows      end_ns (the reading that closes the interval), energy_uj, busy_s, prefill_tokens,
            decode_tokens, spec_tokens (float64 sums over the interval's steps; busy_s: their durations)
  members   step_id, request_id, num_tokens, prefill, decode, spec (int64), resolved (bool, per step)
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

#: Kinds of tokens, and the step columns that count them.
KINDS = ("prefill", "decode", "spec")
STEP_KIND_COLUMNS = {"prefill": "prefill_tokens", "decode": "decode_tokens", "spec": "spec_tokens"}
#: Regressors of the energy model, in the order of `normal_equations`: step seconds, then tokens.
REGRESSORS = ("busy_s", *STEP_KIND_COLUMNS.values())
MEMBER_COLUMNS = {"step_id": "int64", "request_id": "int64", "num_tokens": "int64", "prefill": "int64",
                  "decode": "int64", "spec": "int64", "resolved": "bool"}
ROW_COLUMNS = ("end_ns", "energy_uj", *REGRESSORS)
#: A fit is used once it has at least this many intervals per regressor it has seen (static power
#: included: an overdetermined system, one noisy interval cannot set a coefficient alone), and
#: MIN_FIT_INTERVALS in all; until then token share.
MIN_INTERVALS_PER_KIND = 2
MIN_FIT_INTERVALS = 4
#: The shortest interval the fit takes. Readings closer together are merged (`merge_short_intervals`)
#: before they enter it: a GPU's energy counter lags the work that moves it (its power sensor
#: averages), so over a short interval the energy and the tokens that drew it fall apart. On the H200
#: (llama-8b-shape, BENCHMARKS.md) a 0.1 s sampler's fit put 256 W into static power (idle: 125 W);
#: merged to 0.9 s, 134 W, as the 1 s sampler's fits (117 and 157 W). A reading interval of the
#: default 1 s sampler (ms of jitter) stays alone.
MIN_FIT_SPAN_NS = 900_000_000


@dataclass(frozen=True)
class TokenCosts:
    """A fitted energy model: dynamic uJ per token of each kind, and static power (W) while steps run.
    intervals: how many counter intervals it was fitted on; usable: enough intervals, and every
    regressor seen in them could be told apart (full rank)."""

    prefill_uj: float = 0.0
    decode_uj: float = 0.0
    spec_uj: float = 0.0
    static_w: float = 0.0
    intervals: int = 0
    usable: bool = False
    #: "fitted": static_w is the fit's own coefficient; "measured idle": it was held at the GPU's power
    #: measured while no step ran (the joules per token fitted on the energy above it).
    static_from: str = "fitted"

    def describe(self) -> dict[str, object]:
        fitted = self.static_from == "fitted"
        static = ("the GPU's static power while steps run, fitted" if fitted else
                  "held at the GPU's measured idle power (no step running), so dynamic means the energy above idle")
        cut = ("cut into dynamic and static in the model's proportion" if fitted else
               "cut into static (static_w x its time, at most its energy) and dynamic (the rest)")
        return {"static_w": self.static_w, "static_from": self.static_from,
                "prefill_mj_per_token": self.prefill_uj / 1e3,
                "decode_mj_per_token": self.decode_uj / 1e3, "spec_mj_per_token": self.spec_uj / 1e3,
                "intervals_fitted": self.intervals, "usable": self.usable,
                "how": "modelled from measured intervals: least squares of the measured energy of the steps in each "
                       f"interval between two counter readings on their duration (static_w: {static}) and their "
                       "prefill, decode and draft token counts (dynamic joules per token), coefficients >= 0; a "
                       f"step's energy is {cut}, and both are split over its requests by their tokens times their "
                       "kind's dynamic joules per token"}


def interval_rows(measured: pd.DataFrame, readings_ns: np.ndarray) -> pd.DataFrame:
    """rows (module docstring): the measured steps summed per counter interval, a step counted in the
    interval its midpoint lies in (its key: the first reading after the midpoint). readings_ns: the
    counter's reading times, sorted; a step after the last reading is keyed by the last."""
    if measured.empty or len(readings_ns) == 0:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c == "end_ns" else "float64") for c in ROW_COLUMNS})
    mid = (measured["start_ns"].to_numpy(np.int64) + measured["end_ns"].to_numpy(np.int64)) // 2
    at = np.minimum(np.searchsorted(readings_ns, mid, side="right"), len(readings_ns) - 1)
    rows = measured[["energy_uj", *STEP_KIND_COLUMNS.values()]].astype(np.float64).assign(
        busy_s=(measured["end_ns"].to_numpy(np.int64) - measured["start_ns"].to_numpy(np.int64)) / 1e9,
        end_ns=np.asarray(readings_ns, np.int64)[at])
    return rows.groupby("end_ns", sort=True, as_index=False).sum()[list(ROW_COLUMNS)]


def merge_short_intervals(rows: pd.DataFrame, from_ns: int,
                          min_span_ns: int = MIN_FIT_SPAN_NS) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Consecutive rows (interval_rows, sorted by end_ns, the first interval starting at from_ns)
    summed into intervals of at least min_span_ns. Returns (the merged intervals, each keyed by its
    last reading; the rows after the last of them, not yet long enough; the start of those rows)."""
    ends = rows["end_ns"].to_numpy(np.int64)
    group = np.zeros(len(rows), np.int64)
    start, g, cut = from_ns, 0, 0
    for i, end in enumerate(ends):
        group[i] = g
        if end - start >= min_span_ns:
            start, g, cut = int(end), g + 1, i + 1
    done = rows.iloc[:cut]
    sums = done.drop(columns="end_ns").groupby(group[:cut], sort=True).sum()
    merged = sums.assign(end_ns=done.groupby(group[:cut], sort=True)["end_ns"].max()).reset_index(drop=True)
    return merged[list(rows.columns)], rows.iloc[cut:].reset_index(drop=True), start


def normal_equations(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int]:
    """(X'X 4x4, X'y 4, rows used) of complete intervals: X = REGRESSORS (busy seconds, prefill,
    decode and spec tokens), y = energy_uj. Sums, so a run's fit is the sum over its polls."""
    x = rows[list(REGRESSORS)].to_numpy(np.float64)
    y = rows["energy_uj"].to_numpy(np.float64)
    return x.T @ x, x.T @ y, len(rows)


def fit_token_costs(xtx: np.ndarray, xty: np.ndarray, intervals: int, static_w: float | None = None) -> TokenCosts:
    """The non-negative least-squares fit from the normal equations: among the regressors that were
    ever nonzero, every subset is solved unconstrained and the best one whose coefficients are all
    >= 0 wins (with four columns, 15 subsets, that is exact NNLS). The columns are scaled to unit
    norm first: seconds and token counts lie orders of magnitude apart.

    static_w given (the GPU's measured idle power): the static coefficient is held there and the
    token columns are fitted on the energy above it, y - static x busy_s, whose normal equations
    follow from the same sums (X'y less the busy_s column of X'X times the static power)."""
    held = static_w is not None
    if held:
        xty = xty - xtx[:, 0] * (static_w * 1e6)
    seen = [i for i in range(1 if held else 0, len(REGRESSORS)) if xtx[i, i] > 0]
    if not seen:
        return TokenCosts(intervals=intervals)
    scale = np.zeros(len(REGRESSORS))
    scale[seen] = 1 / np.sqrt(np.diag(xtx)[seen])
    xtx, xty = xtx * np.outer(scale, scale), xty * scale  # the fit of y on X diag(scale): b = scale * b'
    usable = (intervals >= max(MIN_FIT_INTERVALS, MIN_INTERVALS_PER_KIND * len(seen))
              and np.linalg.matrix_rank(xtx[np.ix_(seen, seen)]) == len(seen))
    best, best_obj = np.zeros(len(REGRESSORS)), 0.0  # all zeros: objective 0 (of b'Gb - 2h'b)
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
                best, best_obj = np.zeros(len(REGRESSORS)), obj
                best[list(cols)] = b
    static_uw, prefill, decode, spec = (best * scale).tolist()
    return TokenCosts(prefill, decode, spec, static_w=float(static_w) if held else static_uw / 1e6,
                      intervals=intervals, usable=bool(usable), static_from="measured idle" if held else "fitted")


def step_dynamic_share(steps: pd.DataFrame, costs: TokenCosts, energy_uj: np.ndarray | None = None) -> np.ndarray:
    """Each step's modelled dynamic share of its energy, D / (D + S) (module docstring): D its token
    cost from its own totals (prefill_tokens, decode_tokens, spec_tokens), S static_w times its
    duration (end_ns - start_ns). NaN while `costs` is not usable, or where D + S is 0.

    With the static power held at the measured idle power (costs.static_from) and the steps' measured
    energy_uj given, the share is what lies above idle, (E - S) / E clipped to [0, 1]: the static
    part is then measured, not modelled, and the dynamic part is the rest of the measured energy,
    as a known answer measured from the counter defines it. (With a fitted static power the
    proportion keeps the fit's error off the static part alone: on the H200, fitted static powers
    of 117-157 W for a 125 W idle.)"""
    s = costs.static_w * (steps["end_ns"].to_numpy(np.int64) - steps["start_ns"].to_numpy(np.int64)) / 1e3  # uJ
    if costs.static_from != "fitted" and energy_uj is not None:
        e = np.asarray(energy_uj, np.float64)
        share = np.clip(np.divide(e - s, e, out=np.full(len(steps), np.nan), where=e > 0), 0.0, 1.0)
        return share if costs.usable else np.full(len(steps), np.nan)
    d = sum(getattr(costs, f"{k}_uj") * steps[c].to_numpy(np.float64) for k, c in STEP_KIND_COLUMNS.items())
    d = np.broadcast_to(np.asarray(d, np.float64), (len(steps),))
    total = d + s
    share = np.divide(d, total, out=np.full(len(steps), np.nan), where=total > 0)
    return share if costs.usable else np.full(len(steps), np.nan)


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
