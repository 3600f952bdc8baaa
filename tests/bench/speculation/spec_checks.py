"""What the speculation A/B tests assert of the agent's advice, shared by the bench's fixed-batch A/B
(test_spec_ab.py) and the demo's own load (test_demo_spec_ab.py)."""
from __future__ import annotations

import statistics
from typing import Any


def advice_contradictions(advice: dict[str, dict[str, Any]], measured: dict[str, list[float]]) -> list[tuple]:
    """(task, measured median, action) for each task whose advice goes against the measured speedup's side
    of 1: disable where it measured >= 1, keep where it measured < 1, inconclusive where the printed interval
    does not hold 1."""
    wrong = []
    for task, a in advice.items():
        m = statistics.median(measured[task])
        ok = {"disable_speculation": m < 1.0, "keep_speculation": m >= 1.0,
              "inconclusive": a["speedup_low"] < 1.0 <= a["speedup_high"]}.get(a["action"], False)
        if not ok:
            wrong.append((task, round(m, 4), a["action"], a.get("reason")))
    return wrong


def step_in_turn(loops: list, first: int, poll: Any) -> None:
    """Step every loop (each has step() -> bool) in turn until all are done, who goes first rotating from
    `first`, so that the machine's drift hits them alike; poll() every 8 turns, as an agent beside the
    engine polls (the ring never fills)."""
    turn = first
    while any([lp.step() for lp in loops[turn % len(loops):] + loops[:turn % len(loops)]]):
        turn += 1
        if turn % 8 == 0:
            poll()


def agent_prediction(agent: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """What the agent prints after a last poll: the summary's per-task prediction, the diagnosis' advice by task."""
    from infersight.agent.api import report

    agent.poll_once()
    return (report.summary(agent.state)["spec"]["by_task"],
            {a["task"]: a for a in report.diagnosis(agent.state)["speculation_recommendations"]})


def not_from_probe_steps(predicted: dict[str, dict[str, Any]], tasks: list[str]) -> list[tuple]:
    """(task, basis, how) for each task the agent did not predict from plain probe steps as it says it does:
    every task predicted, basis predicted_from_probe_steps, `how` naming it a prediction, samples of both kinds."""
    if set(predicted) != set(tasks):
        return [("tasks", sorted(predicted), sorted(tasks))]
    return [(task, p["basis"], p["how"]) for task, p in predicted.items()
            if p["basis"] != "predicted_from_probe_steps" or not p["how"].startswith("predicted, not measured: estimated from ")
            or not (p["samples"]["probe_steps"] > 0 and p["samples"]["spec_steps"] > 0)]
