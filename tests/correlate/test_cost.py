"""step_cost_shares / cost_by_request / cost_by_task on hand-built steps and batch frames."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.cost import cost_by_request, cost_by_task, step_cost_shares

SHARE_COLUMNS = ["step_id", "request_id", "num_tokens", "share", "gpu_seconds", "joules"]

STEPS = pd.DataFrame({"step_id": [1, 2, 3, 4], "start_ns": [1000, 2000, 3000, 4000],
                      "end_ns": [1010, 2007, 3100, 4050]})          # durations 10, 7, 100, 50 ns
BATCH = pd.DataFrame({"step_id": [1, 1, 2, 2, 2, 3, 5], "request_id": [1, 2, 1, 2, 3, 3, 4],
                      "num_tokens": [3, 1, 1, 1, 1, 5, 2]})          # step 5 has no step record
ENERGY = pd.DataFrame({"step_id": [1, 3], "joules": [4.0, 10.0]})


def ns(seconds: pd.Series) -> list[int]:
    return [round(s * 1e9) for s in seconds]


def test_step_cost_shares() -> None:
    out = step_cost_shares(STEPS, BATCH, ENERGY)
    assert list(out.columns) == SHARE_COLUMNS
    # Step 5 is dropped (no duration); step 4 had no members.
    assert out[["step_id", "request_id", "num_tokens"]].values.tolist() == \
        [[1, 1, 3], [1, 2, 1], [2, 1, 1], [2, 2, 1], [2, 3, 1], [3, 3, 5]]
    assert list(out.share) == pytest.approx([0.75, 0.25, 1 / 3, 1 / 3, 1 / 3, 1.0])
    # Step 1: 10 * 3/4 = 7.5, 10 * 1/4 = 2.5 -> floors 7, 2, one ns left, equal remainders -> batch order: 8, 2.
    # Step 2: 7/3 each -> floors 2, 2, 2, one left -> 3, 2, 2.  Step 3: 100.
    assert ns(out.gpu_seconds) == [8, 2, 3, 2, 2, 100]
    # Joules: step 1 4.0 * (0.75, 0.25); step 2 has no energy sample; step 3 10.0.
    assert list(out.joules) == pytest.approx([3.0, 1.0, math.nan, math.nan, math.nan, 10.0], nan_ok=True)
    per_step = out.groupby("step_id")
    assert per_step["share"].sum().tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert [sum(ns(g.gpu_seconds)) for _, g in per_step] == [10, 7, 100]
    # Inputs unchanged.
    assert len(BATCH) == 7 and list(STEPS.columns) == ["step_id", "start_ns", "end_ns"]


def test_step_cost_shares_without_energy_and_zero_token_step() -> None:
    out = step_cost_shares(pd.DataFrame({"step_id": [6], "start_ns": [0], "end_ns": [3]}),
                           pd.DataFrame({"step_id": [6, 6], "request_id": [5, 6], "num_tokens": [0, 0]}))
    # No tokens fed: split evenly, 3 ns -> 1.5 each -> 2, 1.
    assert list(out.share) == [0.5, 0.5] and ns(out.gpu_seconds) == [2, 1]
    assert out.joules.isna().all()


def test_cost_by_request_and_task() -> None:
    shares = step_cost_shares(STEPS, BATCH, ENERGY)
    by_req = cost_by_request(shares)
    assert list(by_req.columns) == ["request_id", "gpu_seconds", "joules"]
    # r1: 8 + 3 = 11 ns, 3.0 J; r2: 2 + 2 = 4 ns, 1.0 J; r3: 2 + 100 = 102 ns, 10.0 J.
    assert list(by_req.request_id) == [1, 2, 3]
    assert ns(by_req.gpu_seconds) == [11, 4, 102]
    assert list(by_req.joules) == pytest.approx([3.0, 1.0, 10.0])
    # r2 is not in `requests` -> "other"; chat = r1 + r3: 113 ns, 13 J, 2 requests.
    requests = pd.DataFrame({"request_id": [1, 3], "task": ["chat", "chat"]})
    by_task = cost_by_task(shares, requests)
    assert list(by_task.columns) == ["task", "gpu_seconds", "joules", "requests"]
    assert list(by_task.task) == ["chat", "other"]
    assert ns(by_task.gpu_seconds) == [113, 4]
    assert list(by_task.joules) == pytest.approx([13.0, 1.0])
    assert list(by_task.requests) == [2, 1]
    # Without energy, joules stay NaN after summing.
    assert np.isnan(cost_by_request(step_cost_shares(STEPS, BATCH)).joules).all()


def test_empty_cost() -> None:
    shares = step_cost_shares(STEPS.iloc[:0], BATCH.iloc[:0])
    assert shares.empty and list(shares.columns) == SHARE_COLUMNS
    assert list(cost_by_request(shares).columns) == ["request_id", "gpu_seconds", "joules"]
    assert list(cost_by_task(shares, pd.DataFrame({"request_id": [], "task": []})).columns) == \
        ["task", "gpu_seconds", "joules", "requests"]
