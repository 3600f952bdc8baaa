"""EnergyFit on a tiny case: an interval enters the fit once the account has passed its end, its
steps summed across the polls that brought them; the open ones wait."""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.agent.energy_fit import EnergyFit
from infersight.agent.gpu_config import MIN_FIT_SPAN_NS, GpuConfig
from infersight.correlate import token_cost

MS = 1_000_000
READINGS = np.array([1000, 2000, 3000]) * MS


def _steps(*rows: tuple[int, int, int, int]) -> pd.DataFrame:
    """(start ms, end ms, decode tokens, energy uJ) each."""
    return pd.DataFrame([{"step_id": i, "prefill_tokens": 0, "decode_tokens": d, "spec_tokens": 0,
                          "start_ns": s * MS, "end_ns": e * MS, "energy_uj": uj} for i, (s, e, d, uj) in enumerate(rows)])


def test_an_interval_enters_once_complete_with_the_steps_of_every_poll() -> None:
    fit = EnergyFit()
    # Interval (1 s, 2 s] gets a step in this poll, interval (2 s, 3 s] one too; the account stands at 2 s.
    fit.add(_steps((1100, 1300, 4, 500), (2100, 2300, 2, 300)), READINGS, 2000 * MS)
    assert fit.intervals == 1
    assert fit.open_rows[["end_ns", "decode_tokens", "energy_uj"]].values.tolist() == [[3000 * MS, 2.0, 300.0]]
    # The next poll brings another step of the open interval and passes its end: it enters whole.
    fit.add(_steps((2500, 2700, 3, 450)), READINGS, 3000 * MS)
    assert fit.intervals == 2 and fit.open_rows.empty
    # X'y for the decode column: 4 x 500 + (2 + 3) x (300 + 450)
    assert fit.xty[2] == 4 * 500 + 5 * 750


def test_a_fast_samplers_intervals_enter_the_fit_merged_to_a_second() -> None:
    fit = EnergyFit(MIN_FIT_SPAN_NS)
    readings = np.arange(0, 2001, 100) * MS  # every 100 ms
    # One 2-token step in each 100-ms interval up to 2 s; the account stands at 1.5 s.
    steps = _steps(*[(t + 10, t + 60, 2, 100) for t in range(0, 2000, 100)])
    fit.add(steps, readings, 1500 * MS)
    # Complete: the intervals ending at 100..1500 ms. Merged from 0: 0-900 ms (nine) enters the fit;
    # 900-1500 ms (six) is not 0.9 s long yet and waits; 1500-2000 ms is still open.
    assert fit.intervals == 1 and fit.xty[2] == (9 * 2) * (9 * 100)
    assert fit.short_rows["end_ns"].tolist() == [t * MS for t in range(1000, 1501, 100)]
    fit.add(steps.iloc[:0], readings, 2000 * MS)
    # 900-1800 ms is long enough now; 1900 and 2000 wait.
    assert fit.intervals == 2 and fit.xty[2] == 18 * 900 + 18 * 900
    assert fit.short_rows["end_ns"].tolist() == [1900 * MS, 2000 * MS]


def test_the_agents_default_is_token_costs_shortest_fit_interval() -> None:
    assert MIN_FIT_SPAN_NS == token_cost.MIN_FIT_SPAN_NS
    assert GpuConfig().energy_fit_min_s * 1e9 == token_cost.MIN_FIT_SPAN_NS
