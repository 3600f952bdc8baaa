"""The greedy expert replication plan on hand-computed loads (exact expected plans)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.expert_parallel import plan_replication
from infersight.runtime.parallel.placement import LayerPlacement


def test_one_replica_of_the_hot_expert_balances_two_ranks():
    # home: rank 0 {0, 1} = 12, rank 1 {2, 3} = 4; mean 8
    plan = plan_replication([8, 4, 2, 2], world=2, extra_replicas=1)
    assert plan.replicas == ((0, 1),)
    assert plan.rank_load["load_before"].tolist() == [12, 4]
    assert plan.rank_load["load_after"].tolist() == [8, 8]  # expert 0 split 4 + 4
    assert plan.balance_before == 1.5 and plan.balance_after == 1.0
    assert plan.placement.to_dict("list") == {
        "rank": [0, 0, 1, 1, 1], "slot": [0, 1, 0, 1, 2], "expert": [0, 1, 2, 3, 0],
        "replica": [False, False, False, False, True], "load": [4.0, 4.0, 2.0, 2.0, 4.0]}


def test_greedy_passes_over_experts_no_rank_can_take_and_may_overshoot():
    # slots per rank: 2 home + ceil(2 / 2) = 3. After (0, 1) both ranks carry 8. Next, expert 0
    # (4 per copy) is on both ranks and expert 1 (4) fits only on rank 1, which is full; expert 2
    # (2) goes to rank 0: 4 + 4 + 1 = 9 against 4 + 1 + 2 = 7. The greedy made the maximum worse.
    plan = plan_replication([8, 4, 2, 2], world=2, extra_replicas=2)
    assert plan.replicas == ((0, 1), (2, 0))
    assert plan.rank_load["load_after"].tolist() == [9, 7]
    assert plan.balance_after == 9 / 8


def test_plan_stops_when_no_copy_can_be_placed():
    plan = plan_replication([8, 4, 2, 2], world=2, extra_replicas=3, max_slots_per_rank=3)
    assert plan.replicas == ((0, 1), (2, 0))  # the third finds no rank with room for any expert
    assert plan_replication([8, 4, 2, 2], world=2, extra_replicas=2, max_slots_per_rank=2).replicas == ()


def test_hot_expert_spread_over_four_ranks():
    # home: r0 {0,1} = 11, r1 {2,3} = 2, r2 {4,5} = 2, r3 {6,7} = 2; mean 17/4; slots per rank 3.
    # 1st copy of expert 0 (10): ranks 1-3 tie at 2 -> rank 1 (5 per copy: loads 6, 7, 2, 2)
    # 2nd (5 per copy): free ranks 2, 3 (rank 1 is full) -> rank 2 (10/3 per copy)
    # 3rd (10/3 per copy): only rank 3 has room -> 2.5 per copy: loads 3.5, 4.5, 4.5, 4.5
    plan = plan_replication([10, 1, 1, 1, 1, 1, 1, 1], world=4, extra_replicas=3)
    assert plan.replicas == ((0, 1), (0, 2), (0, 3))
    np.testing.assert_allclose(plan.rank_load["load_after"], [3.5, 4.5, 4.5, 4.5])
    assert plan.balance_before == pytest.approx(11 / 4.25)
    assert plan.balance_after == pytest.approx(4.5 / 4.25)


def test_ties_pick_the_lower_expert_and_the_lower_rank():
    # experts 0 and 2 tie at 6; expert 0 goes first, to rank 1 (the only rank without it)
    plan = plan_replication([6, 0, 6, 0], world=2, extra_replicas=2)
    assert plan.replicas == ((0, 1), (2, 0))
    assert plan.rank_load["load_after"].tolist() == [6, 6]


def test_no_load_or_no_budget_changes_nothing():
    empty = plan_replication([0, 0, 0, 0], world=2, extra_replicas=2)
    assert empty.replicas == () and math.isnan(empty.balance_before) and math.isnan(empty.balance_after)
    none = plan_replication([5, 1, 1, 1], world=2, extra_replicas=0)
    assert none.replicas == () and none.balance_before == none.balance_after == 6 / 4


def test_uneven_home_shards_match_the_runtime_placement():
    loads = pd.Series([1, 9, 1, 1, 1])  # 5 experts on 2 ranks: rank 0 {0, 1}, rank 1 {2, 3, 4}
    plan = plan_replication(loads, world=2, extra_replicas=1)
    assert plan.replicas == ((1, 1),)
    runtime = LayerPlacement.contiguous(5, 2).with_replicas(plan.replicas)
    by_rank = plan.placement.groupby("rank")["expert"].apply(tuple).tolist()
    assert tuple(by_rank) == runtime.slots == ((0, 1), (2, 3, 4, 1))


def test_inputs_are_not_mutated_and_bad_inputs_raise():
    loads = np.array([8.0, 4.0, 2.0, 2.0])
    series = pd.Series([8, 4, 2, 2])
    plan_replication(loads, 2, 2)
    plan_replication(series, 2, 2)
    assert loads.tolist() == [8, 4, 2, 2] and series.tolist() == [8, 4, 2, 2]
    with pytest.raises(ValueError):
        plan_replication([1, 1], world=3, extra_replicas=1)
    with pytest.raises(ValueError):
        plan_replication([1, -1], world=2, extra_replicas=1)
