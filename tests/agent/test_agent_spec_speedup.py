"""The agent's speculation figures from a real (tiny) engine run with plain probe steps: the step
timings reach its window, the summary says how each figure was obtained, the gauge and the advice
carry the predicted speedup, named a prediction."""
from __future__ import annotations

import pytest
from agent_workload import make_engine, run_workload, unique_ring
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infersight.agent.api import report
from infersight.agent.config import AgentConfig
from infersight.agent.service import Agent
from infersight.exporters import catalogue as C


@pytest.fixture(scope="module")
def run():
    ring = unique_ring("spec-speedup")
    engine, probe = make_engine(ring)
    agent = Agent(AgentConfig(rings=[ring], port=0))
    try:
        work = run_workload(engine, agent.poll_once)
        agent.poll_once()
        yield work, agent
    finally:
        agent.close()
        probe.close()


def test_probe_and_speculative_steps_reach_the_window(run) -> None:
    work, agent = run
    kept = agent.state.spec_step_timing
    probes = [s for s in work.steps if s.spec_probe]
    drafted = [s for s in work.steps if s.num_spec_tokens > 0]
    assert probes and drafted
    assert sorted(kept.loc[kept["spec_probe"], "step_id"]) == [s.step_id for s in probes]
    assert sorted(kept.loc[~kept["spec_probe"], "step_id"]) == [s.step_id for s in drafted]


def test_summary_gauge_and_advice_agree(run) -> None:
    _, agent = run
    by_task = report.summary(agent.state)["spec"]["by_task"]
    measured = {t: s for t, s in by_task.items() if s["basis"] == "predicted_from_probe_steps"}
    assert measured, by_task
    for task, s in measured.items():
        low, high = s["speedup_interval"]
        assert low <= s["predicted_speedup"] <= high
        assert s["how"].startswith("predicted, not measured: estimated from ") and s["samples"]["probe_steps"] >= 1
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(agent.registry).decode())}
    gauge = {smp.labels["task"]: smp.value for smp in fams[C.SPEC_PREDICTED_SPEEDUP.name].samples}
    assert gauge == pytest.approx({t: s["predicted_speedup"] for t, s in measured.items()})
    recs = report.diagnosis(agent.state)["speculation_recommendations"]
    assert sorted(r["task"] for r in recs) == sorted(measured)
    for r in recs:
        assert r["speedup"] == pytest.approx(measured[r["task"]]["predicted_speedup"])
        assert r["action"] in ("keep_speculation", "disable_speculation", "inconclusive")


def test_engines_are_told_apart_as_the_agent_offsets_them() -> None:
    from infersight.agent.rings.ingest import RING_ID_SHIFT
    from infersight.correlate.spec_speedup import ENGINE_ID_SHIFT

    assert ENGINE_ID_SHIFT == RING_ID_SHIFT
