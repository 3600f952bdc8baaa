"""Speculation advice per task, from the measured speedup and its interval (spec_speedup).

Only tasks whose speedup was measured (basis "measured") get advice: a guess from acceptance
alone is what this replaces. The advice is about speculation at the gamma it runs with: the
engine measures no other draft length, and a model of one (fewer draft forwards, the same
verify) predicted 1.4-1.7x at gamma 1 on a CPU where `infersight bench speculation` measured
0.76-0.87x, so no gamma is advised on a model's word.
"""
from __future__ import annotations

import math

import pandas as pd

from infersight.correlate.spec_speedup import MEASURED


def _how(row: object) -> str:
    r = row
    return (f"measured at batch ~{r.mean_batch:.0f}, {r.mean_accepted_length:.2f} tokens per speculative step of "
            f"{r.spec_step_ms:.2f} ms vs 1 per plain step of {r.plain_step_ms:.2f} ms "
            f"over {r.spec_steps} speculative and {r.probe_steps} plain probe steps, {r.timed_verifications} "
            f"verifications")


def recommendations(by_task: pd.DataFrame) -> list[dict[str, object]]:
    """One advice per measured task: dicts with task, action, speedup (the measured figure at
    the running gamma), speedup_low / speedup_high (its interval) and reason. Actions:

      disable_speculation  the whole interval is below 1: speculation slows this task's decode
      keep_speculation     the whole interval is at or above 1
      inconclusive         the interval holds 1: no effect measurable yet in either direction
    """
    out: list[dict[str, object]] = []
    for row in by_task.itertuples(index=False):
        s = float(row.predicted_speedup)
        if row.basis != MEASURED or not math.isfinite(s):
            continue
        low, high = float(row.speedup_low), float(row.speedup_high)
        span, how = f"{s:.2f}x ({low:.2f}-{high:.2f}x)", _how(row)
        if high < 1.0:
            action, reason = "disable_speculation", f"speculation slows decode: {span}; {how}"
        elif low >= 1.0:
            action, reason = "keep_speculation", f"speculation speeds decode: {span}; {how}"
        else:
            action, reason = "inconclusive", f"no effect measurable yet: {span} holds 1; more steps will narrow it; {how}"
        out.append({"task": str(row.task), "action": action, "speedup": s, "speedup_low": low, "speedup_high": high,
                    "reason": reason})
    return out
