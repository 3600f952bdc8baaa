"""spec_advice: modelled gammas and the advice rules, on hand-written speedup rows (worked out in
the comments)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from infersight.correlate.spec_advice import gamma_options, recommendations
from infersight.correlate.spec_speedup import MEASURED, NO_PROBES, SPEEDUP_COLUMNS


def _row(task: str, s: float, low: float, high: float, d: float, v: float, f: float, ts: float, tp: float,
         basis: str = MEASURED) -> dict[str, object]:
    row: dict[str, object] = {c: 0 for c in SPEEDUP_COLUMNS}
    row.update(task=task, predicted_speedup=s, speedup_low=low, speedup_high=high, draft_ms_per_token=d,
               verify_ms=v, plain_forward_ms=f, spec_step_ms=ts, plain_step_ms=tp, basis=basis, mean_batch=4.0,
               mean_accepted_length=2.0, model_speedup=float("nan"))
    return row


def _positions(survival: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame([{"task": t, "position": i, "proposed": 100, "accepted": round(100 * r), "accept_rate": r}
                         for t, rates in survival.items() for i, r in enumerate(rates)])


# Expensive drafts (d 2 of Ts 10, Tp 2.5 at gamma 4) that rarely survive past the first position:
# survival 0.8 0.1 0.05 0: tau(4) 1.95, S_pure = 1.95 * 2.5 / 10 = 0.4875.
DECREASE = _row("code", 0.49, 0.45, 0.53, d=2, v=3, f=2, ts=10, tp=2.5)
DECREASE_SURVIVAL = [0.8, 0.1, 0.05, 0.0]


def test_gamma_options_follow_the_measured_parts() -> None:
    got = gamma_options(pd.Series(DECREASE), DECREASE_SURVIVAL)
    # Ts(g') = 10 - (4 - g') * 2 (only the draft forwards are saved); tau(g') = 1 + survival[:g']
    expected = {1: 1.8 * 2.5 / 4, 2: 1.9 * 2.5 / 6, 3: 1.95 * 2.5 / 8}
    assert got == pytest.approx({g: 0.49 * v / 0.4875 for g, v in expected.items()})
    assert gamma_options(pd.Series(DECREASE), [0.5]) == {}  # nothing below gamma 1


def test_each_action_and_its_reason() -> None:
    rows = pd.DataFrame([
        DECREASE,
        _row("creative", 0.4, 0.35, 0.45, d=1, v=3, f=2, ts=8, tp=2.5),
        # cheap drafts, well accepted, but the last position survives only 30%: keep
        _row("chat", 1.3, 1.1, 1.5, d=0.1, v=2.2, f=2, ts=3, tp=2),
        # the last position survives 85%: one more may gain; bound = 1.5 * (5.45 * 2 / 3.1) / (4.6 * 2 / 3)
        _row("json", 1.5, 1.2, 1.8, d=0.1, v=2.2, f=2, ts=3, tp=2),
        _row("qa", 1.05, 0.9, 1.2, d=0.1, v=2.1, f=2, ts=3, tp=2),
        _row("math", 0.5, 0.4, 0.6, d=1, v=3, f=2, ts=8, tp=2.5, basis=NO_PROBES),
    ]).astype(SPEEDUP_COLUMNS)
    positions = _positions({"code": DECREASE_SURVIVAL, "creative": [0.02, 0.0, 0.0, 0.0],
                            "chat": [0.7, 0.5, 0.4, 0.3], "json": [0.95, 0.9, 0.9, 0.85],
                            "qa": [0.5, 0.2, 0.1, 0.05], "math": [0.1, 0.0, 0.0, 0.0]})
    recs = {r["task"]: r for r in recommendations(rows, positions)}
    assert {t: r["action"] for t, r in recs.items()} == {
        "code": "decrease_gamma", "creative": "disable_speculation", "chat": "keep_speculation",
        "json": "increase_gamma", "qa": "inconclusive"}  # math: not measured, no advice
    assert recs["code"]["gamma"] == 1
    assert recs["code"]["modelled_speedup"] == pytest.approx(0.49 * (1.8 * 2.5 / 4) / 0.4875)
    assert recs["json"]["gamma"] == 5
    assert recs["json"]["modelled_speedup"] == pytest.approx(1.5 * (5.45 * 2 / 3.1) / (4.6 * 2 / 3))
    assert recs["creative"]["reason"].startswith("speculation slows decode: 0.40x (0.35-0.45x); measured at batch ~4")
    assert (recs["qa"]["speedup_low"], recs["qa"]["speedup_high"]) == (0.9, 1.2)
    assert recommendations(rows.iloc[:0], positions) == []


def test_without_positions_no_gamma_is_modelled() -> None:
    rows = pd.DataFrame([DECREASE]).astype(SPEEDUP_COLUMNS)
    (rec,) = recommendations(rows)
    assert rec["action"] == "disable_speculation" and math.isclose(rec["speedup"], 0.49)
