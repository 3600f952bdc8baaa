"""Speculation advice per task, from the predicted speedup and its interval (spec_speedup).

Only tasks whose speedup was predicted from timed plain probe steps (basis
"predicted_from_probe_steps") get advice: a guess from acceptance alone is what this replaces.
The prediction rests on measured step times, but it is a prediction: `infersight bench
speculation` measures the speedup itself, and CI checks that no advice contradicts that
measurement's sign (tests/bench/speculation/test_spec_ab.py). The advice is about speculation at the gamma it runs with: the
engine measures no other draft length, and a model of one (fewer draft forwards, the same
verify) predicted 1.4-1.7x at gamma 1 on a CPU where `infersight bench speculation` measured
0.76-0.87x, so no gamma is advised on a model's word.
"""
from __future__ import annotations

import math

import pandas as pd

from infersight.correlate.spec_speedup import PREDICTED


def _how(row: object) -> str:
    r = row
    return (f"predicted from {r.probe_steps} plain probe steps and {r.spec_steps} speculative steps at batch "
            f"~{r.mean_batch:.0f} ({r.timed_verifications} verifications): {r.mean_accepted_length:.2f} tokens per "
            f"speculative step of {r.spec_step_ms:.2f} ms (measured) vs 1 per plain step of {r.plain_step_ms:.2f} ms "
            f"(measured)")


def recommendations(by_task: pd.DataFrame) -> list[dict[str, object]]:
    """One advice per predicted task: dicts with task, action, speedup (the predicted figure at
    the running gamma), speedup_low / speedup_high (its interval), basis and reason. Actions:

      disable_speculation  the whole interval is below 1: speculation slows this task's decode
      keep_speculation     the whole interval is at or above 1
      inconclusive         the interval holds 1: no effect measurable yet in either direction
    """
    out: list[dict[str, object]] = []
    for row in by_task.itertuples(index=False):
        s = float(row.predicted_speedup)
        if row.basis != PREDICTED or not math.isfinite(s):
            continue
        low, high = float(row.speedup_low), float(row.speedup_high)
        span, how = f"{s:.2f}x ({low:.2f}-{high:.2f}x)", _how(row)
        if high < 1.0:
            action, reason = "disable_speculation", f"speculation is predicted to slow decode: {span}; {how}"
        elif low >= 1.0:
            action, reason = "keep_speculation", f"speculation is predicted to speed decode: {span}; {how}"
        else:
            action, reason = "inconclusive", f"no effect measurable yet: {span} holds 1; more steps will narrow it; {how}"
        out.append({"task": str(row.task), "action": action, "speedup": s, "speedup_low": low, "speedup_high": high,
                    "basis": PREDICTED, "reason": reason})
    return out
