"""step_cost_shares / split_by_tokens / cost_by_request / cost_by_task on hand-built steps and batch frames."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.cost import cost_by_request, cost_by_task, split_by_tokens, step_cost_shares

SHARE_COLUMNS = ["step_id", "request_id", "num_tokens", "share", "engine_seconds", "energy_uj", "gpu_sm_active_ns"]
REQUEST_COLUMNS = ["request_id", "engine_seconds", "energy_j", "gpu_sm_active_s"]

STEPS = pd.DataFrame({"step_id": [1, 2, 3, 4], "start_ns": [1000, 2000, 3000, 4000],
                      "end_ns": [1010, 2007, 3100, 4050]})          # durations 10, 7, 100, 50 ns
BATCH = pd.DataFrame({"step_id": [1, 1, 2, 2, 2, 3, 5], "request_id": [1, 2, 1, 2, 3, 3, 4],
                      "num_tokens": [3, 1, 1, 1, 1, 5, 2]})          # step 5 has no step record
# Measured on a GPU: step 1 4 uJ, step 3 10 uJ and 7 ns of SM activity; step 2 unmeasured.
ENERGY = pd.DataFrame({"step_id": [1, 3], "energy_uj": [4.0, 10.0], "gpu_sm_active_ns": [np.nan, 7.0]})


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
    assert ns(out.engine_seconds) == [8, 2, 3, 2, 2, 100]
    # Energy: step 1 4 uJ * (0.75, 0.25); step 2 has no measurement (NaN, not 0); step 3 all of its 10.
    assert list(out.energy_uj) == pytest.approx([3.0, 1.0, math.nan, math.nan, math.nan, 10.0], nan_ok=True)
    assert list(out.gpu_sm_active_ns) == pytest.approx([math.nan] * 5 + [7.0], nan_ok=True)
    per_step = out.groupby("step_id")
    assert per_step["share"].sum().tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert [sum(ns(g.engine_seconds)) for _, g in per_step] == [10, 7, 100]
    # Inputs unchanged.
    assert len(BATCH) == 7 and list(STEPS.columns) == ["step_id", "start_ns", "end_ns"]


def test_step_cost_shares_without_energy_and_zero_token_step() -> None:
    out = step_cost_shares(pd.DataFrame({"step_id": [6], "start_ns": [0], "end_ns": [3]}),
                           pd.DataFrame({"step_id": [6, 6], "request_id": [5, 6], "num_tokens": [0, 0]}))
    # No tokens fed: split evenly, 3 ns -> 1.5 each -> 2, 1.
    assert list(out.share) == [0.5, 0.5] and ns(out.engine_seconds) == [2, 1]
    assert out.energy_uj.isna().all() and out.gpu_sm_active_ns.isna().all()


def test_cost_by_request_and_task() -> None:
    shares = step_cost_shares(STEPS, BATCH, ENERGY)
    by_req = cost_by_request(shares)
    assert list(by_req.columns) == REQUEST_COLUMNS
    # r1: 8 + 3 = 11 ns, 3 uJ; r2: 2 + 2 = 4 ns, 1 uJ; r3: 2 + 100 = 102 ns, 10 uJ (its step 2 part unmeasured).
    assert list(by_req.request_id) == [1, 2, 3]
    assert ns(by_req.engine_seconds) == [11, 4, 102]
    assert list(by_req.energy_j) == pytest.approx([3e-6, 1e-6, 10e-6])
    assert list(by_req.gpu_sm_active_s) == pytest.approx([math.nan, math.nan, 7e-9], nan_ok=True)
    # r2 is not in `requests` -> "other"; chat = r1 + r3: 113 ns, 13 J, 2 requests.
    requests = pd.DataFrame({"request_id": [1, 3], "task": ["chat", "chat"]})
    by_task = cost_by_task(shares, requests)
    assert list(by_task.columns) == ["task", "engine_seconds", "energy_j", "gpu_sm_active_s", "requests"]
    assert list(by_task.task) == ["chat", "other"]
    assert ns(by_task.engine_seconds) == [113, 4]
    assert list(by_task.energy_j) == pytest.approx([13e-6, 1e-6])
    assert list(by_task.requests) == [2, 1]
    # Without a GPU, the GPU figures stay NaN after summing (never 0).
    unmeasured = cost_by_request(step_cost_shares(STEPS, BATCH))
    assert unmeasured.energy_j.isna().all() and unmeasured.gpu_sm_active_s.isna().all()


def test_empty_cost() -> None:
    shares = step_cost_shares(STEPS.iloc[:0], BATCH.iloc[:0])
    assert shares.empty and list(shares.columns) == SHARE_COLUMNS
    assert list(cost_by_request(shares).columns) == REQUEST_COLUMNS
    assert list(cost_by_task(shares, pd.DataFrame({"request_id": [], "task": []})).columns) == \
        ["task", "engine_seconds", "energy_j", "gpu_sm_active_s", "requests"]


def test_split_by_tokens_is_exact_and_leaves_unmeasured_steps_nan() -> None:
    batch = pd.DataFrame({"step_id": [1, 1, 1, 2, 9], "request_id": [1, 2, 3, 1, 4], "num_tokens": [1, 1, 1, 5, 1]})
    # Step 1: 100 uJ / 3 = 33.33 each -> 33, 33, 33 and one left for the first (equal remainders: batch order).
    parts = split_by_tokens(batch, pd.Series([100.0, 7.0], index=[1, 2]))
    assert parts[:4].tolist() == [34.0, 33.0, 33.0, 7.0] and math.isnan(parts[4])
