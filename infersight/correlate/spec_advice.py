"""Speculation advice per task (keep, disable, change gamma), from the measured speedup and its interval.

Input: spec_speedup.speedup_by_task (the measured speedup and the parts of a step) and
speculation.acceptance_by_position (how often each draft position survives). Only tasks whose
speedup was measured (basis "measured") get advice: a guess from acceptance alone is what this
replaces.

Other gammas are modelled from the measured parts, on pure-decode steps, for g' < g (the
acceptance of positions beyond g was never observed), cautiously: a shorter draft saves its
draft forwards (d each: draft time per draft forward) and nothing else, since how the verify
forward and the verification shrink with fewer tokens was not measured (on a CPU they hardly do):

    tau(g')  = 1 + sum_{i < g'} survive_i            (survive_i: accept rate at draft position i)
    Ts(g')   = Ts - (g - g') * d
    S(g')    = tau(g') * Tp / Ts(g'), scaled by predicted_speedup / S(g) so that what the
               measured figure includes beyond pure-decode steps carries over

One more position yields at most survive_{g-1} more tokens for at least d more time, which
bounds S(g + 1) from above. So neither a shorter nor a longer draft is advised on a hope.
"""
from __future__ import annotations

import math

import pandas as pd

from infersight.correlate.spec_speedup import MEASURED

#: A modelled gamma must beat the configured one by this much to be advised.
MIN_GAIN = 0.10
#: Longer drafts are worth trying only while the last position survives this often.
HIGH_SURVIVAL = 0.8


def gamma_options(row: pd.Series | object, survive: list[float]) -> dict[int, float]:
    """Modelled speedup at each gamma g' in 1 .. g-1 (see the module docstring) for one row of
    speedup_by_task; survive[i] is the accept rate at draft position i (len(survive) = g)."""
    g = len(survive)
    d = getattr(row, "draft_ms_per_token")
    ts, tp, s = getattr(row, "spec_step_ms"), getattr(row, "plain_step_ms"), getattr(row, "predicted_speedup")
    if g < 2 or not all(math.isfinite(x) for x in (d, ts, tp, s)):
        return {}
    s_pure = (1.0 + sum(survive)) * tp / ts
    out = {}
    for gp in range(1, g):
        ts_gp = ts - (g - gp) * d
        if ts_gp > 0:
            out[gp] = s * ((1.0 + sum(survive[:gp])) * tp / ts_gp) / s_pure
    return out


def _survival(by_position: pd.DataFrame | None) -> dict[str, list[float]]:
    if by_position is None or by_position.empty:
        return {}
    seen = by_position[by_position["proposed"] > 0].sort_values("position")
    return {str(t): g["accept_rate"].tolist() for t, g in seen.groupby("task")}


def _how(row: object) -> str:
    r = row
    return (f"measured at batch ~{r.mean_batch:.0f}, {r.mean_accepted_length:.2f} tokens per speculative step of "
            f"{r.spec_step_ms:.2f} ms vs 1 per plain step of {r.plain_step_ms:.2f} ms "
            f"over {r.spec_steps} speculative and {r.probe_steps} plain probe steps, {r.timed_verifications} "
            f"verifications")


def recommendations(by_task: pd.DataFrame, by_position: pd.DataFrame | None = None) -> list[dict[str, object]]:
    """One advice per measured task: dicts with task, action, speedup (the measured figure at
    the running gamma) with speedup_low / speedup_high (its interval), reason, and for
    decrease_gamma / increase_gamma the gamma and its modelled speedup (an upper bound for
    increase_gamma). Actions, the first that holds:

      decrease_gamma       a smaller gamma is modelled to beat the running one by MIN_GAIN
                           (and, where speedup < 1, to reach 1 + MIN_GAIN)
      disable_speculation  the whole interval is below 1
      increase_gamma       the whole interval is at or above 1, the last position survives
                           >= HIGH_SURVIVAL, and one more position may gain MIN_GAIN (upper bound)
      keep_speculation     the whole interval is at or above 1
      inconclusive         the interval holds 1: no effect measurable yet in either direction
    """
    survival = _survival(by_position)
    out: list[dict[str, object]] = []
    for row in by_task.itertuples(index=False):
        s = float(row.predicted_speedup)
        if row.basis != MEASURED or not math.isfinite(s):
            continue
        task, how = str(row.task), _how(row)
        surv = survival.get(task, [])
        options = gamma_options(row, surv)
        best = max(options.items(), key=lambda kv: kv[1], default=None)
        low, high = float(row.speedup_low), float(row.speedup_high)
        advice: dict[str, object] = {"task": task, "speedup": s, "speedup_low": low, "speedup_high": high}
        span = f"{s:.2f}x ({low:.2f}-{high:.2f}x)"
        if best is not None and best[1] >= max(1.0, s) * (1 + MIN_GAIN):
            advice |= {"action": "decrease_gamma", "gamma": best[0], "modelled_speedup": best[1],
                       "reason": f"speedup {span} at gamma {len(surv)}; gamma {best[0]} is modelled at "
                                 f"{best[1]:.2f}x from the measured parts; {how}"}
        elif high < 1.0:
            advice |= {"action": "disable_speculation", "reason": f"speculation slows decode: {span}; {how}"}
        elif low >= 1.0:
            bound = _longer_bound(row, surv)
            if surv and surv[-1] >= HIGH_SURVIVAL and bound >= s * (1 + MIN_GAIN):
                advice |= {"action": "increase_gamma", "gamma": len(surv) + 1, "modelled_speedup": bound,
                           "reason": f"speedup {span}; the last draft position survives {surv[-1]:.0%}, "
                                     f"gamma {len(surv) + 1} is bounded at {bound:.2f}x; {how}"}
            else:
                advice |= {"action": "keep_speculation", "reason": f"speculation speeds decode: {span}; {how}"}
        else:
            advice |= {"action": "inconclusive",
                       "reason": f"no effect measurable yet: {span} holds 1; more steps will narrow it; {how}"}
        out.append(advice)
    return out


def _longer_bound(row: object, survive: list[float]) -> float:
    """Upper bound on the speedup with one more draft position (see the module docstring)."""
    r = row
    if not survive or not math.isfinite(r.draft_ms_per_token):
        return float("nan")
    tau = 1.0 + sum(survive)
    ts = r.spec_step_ms
    s_pure = tau * r.plain_step_ms / ts
    return r.predicted_speedup * ((tau + survive[-1]) * r.plain_step_ms / (ts + r.draft_ms_per_token)) / s_pure
