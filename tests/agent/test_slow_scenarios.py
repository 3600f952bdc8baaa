"""Slow-request causes, judged by AgentState from the ring poll by poll as the agent does, on
scenarios built with the real engine (slow_scenarios). Each scenario declares its victims and their
causes before it runs; for every cause it built, the agent's labels must reach precision >= 0.9 and
recall >= 0.8 against them (slow_scenario_kit.Score defines both). One scenario runs under the
agent's default rule (the p99 of the last 1,000 requests). A steady workload must flag about the
quantile's share.

The table of results prints with `pytest tests/agent/test_slow_scenarios.py -q -s`.
"""
from __future__ import annotations

import random

import pytest
from slow_scenario_kit import Driver, Outcome, score_table
from slow_scenarios import SCENARIOS, TINY
from testkit import collector_paused

from infersight.runtime import EngineConfig

PRECISION_GOAL = 0.9
RECALL_GOAL = 0.8


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    out = {}
    for name, build in SCENARIOS.items():
        try:
            with collector_paused():
                out[name] = build()
        except pytest.skip.Exception:
            continue
    print("\n" + score_table(out))
    return out


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_built_cause_is_found_and_named(outcomes: dict[str, Outcome], name: str) -> None:
    if name not in outcomes:
        pytest.skip(f"{name}: not run here")
    o = outcomes[name]
    scores = [o.score(cause) for cause in o.causes()]
    assert scores and all(s.victims >= 5 for s in scores), scores
    failing = [s for s in scores if not (s.precision >= PRECISION_GOAL and s.recall >= RECALL_GOAL)]
    assert not failing, (name, failing, o.explain())


def test_one_scenario_runs_under_the_default_rule(outcomes: dict[str, Outcome]) -> None:
    # A guard: the long prompts are judged with no slow-rule field changed, among enough requests
    # (over 500) that a p99 is the 1% of a real window and not its maximum.
    o = outcomes["long_prompt"]
    assert o.overrides == {} and o.requests > 500, (o.overrides, o.requests)


def test_a_steady_workload_flags_the_quantiles_share() -> None:
    # 120 requests of 2-12 tokens, two arriving every third step; p90 over the last 50 requests,
    # judged from the 20th on: never more than ceil(0.1 x 50) = 5 of the window after a poll, so at
    # most 5 per 50 requests (15 with a poll's slack). How many of the cap are used depends on how many
    # requests pass 1.25x the median, which a quiet run makes fewer (5 were seen; the cap is the claim).
    rng = random.Random(0)
    d = Driver(EngineConfig(model=TINY, block_size=8, num_kv_blocks=64))
    for i in range(60):
        d.add(f"steady {i}", rng.randint(2, 12)), d.add(f"steady {i} b", rng.randint(2, 12))
        d.run(3)
    d.run()
    o = d.judge(quantile=0.9, window=50, min_requests_for_p99=20)
    assert 1 <= len(o.flagged) <= 15, o.flagged
