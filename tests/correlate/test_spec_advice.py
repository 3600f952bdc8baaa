"""spec_advice: the advice rules on hand-written speedup rows."""
from __future__ import annotations

import pandas as pd

from infersight.correlate.spec_advice import recommendations
from infersight.correlate.spec_speedup import NO_PROBES, PREDICTED, SPEEDUP_COLUMNS


def _row(task: str, s: float, low: float, high: float, basis: str = PREDICTED) -> dict[str, object]:
    row: dict[str, object] = {c: 0 for c in SPEEDUP_COLUMNS}
    row.update(task=task, predicted_speedup=s, speedup_low=low, speedup_high=high, basis=basis, mean_batch=4.0,
               mean_accepted_length=2.0, spec_step_ms=8.0, plain_step_ms=2.5, spec_steps=12, probe_steps=3,
               timed_verifications=40, model_speedup=float("nan"))
    return row


def test_each_action_follows_the_interval() -> None:
    rows = pd.DataFrame([
        _row("creative", 0.4, 0.35, 0.45),
        _row("json", 1.3, 1.1, 1.5),
        _row("code", 1.0, 1.0, 1.2),     # the interval's lower end at 1: keep
        _row("qa", 1.05, 0.9, 1.2),
        _row("chat", 0.95, 0.8, 0.9999),
        _row("math", 0.5, 0.4, 0.6, basis=NO_PROBES),
    ]).astype(SPEEDUP_COLUMNS)
    recs = {r["task"]: r for r in recommendations(rows)}
    assert {t: r["action"] for t, r in recs.items()} == {
        "creative": "disable_speculation", "json": "keep_speculation", "code": "keep_speculation",
        "qa": "inconclusive", "chat": "disable_speculation"}  # math: not predicted, no advice
    assert recs["creative"]["reason"] == (
        "speculation is predicted to slow decode: 0.40x (0.35-0.45x); predicted from 3 plain probe steps and 12 "
        "speculative steps at batch ~4 (40 verifications): 2.00 tokens per speculative step of 8.00 ms (measured) vs "
        "1 per plain step of 2.50 ms (measured)")
    assert {r["basis"] for r in recs.values()} == {PREDICTED}
    assert (recs["qa"]["speedup"], recs["qa"]["speedup_low"], recs["qa"]["speedup_high"]) == (1.05, 0.9, 1.2)
    assert recommendations(rows.iloc[:0]) == []
