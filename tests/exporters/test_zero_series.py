"""Counters with a known label set are served at 0 before their first event (MetricSpec.zero_series),
so that increase() over the first scrapes sees the first preemption: a series born at 1 has no earlier
sample to increase from. Checked on a fresh agent state, then after one swap preemption."""
from __future__ import annotations

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infersight.agent.config import AgentConfig
from infersight.agent.state import AgentState
from infersight.exporters import catalogue as C
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.exporters.prometheus import build_registry


def _counted(state: AgentState, spec: C.MetricSpec, label: str) -> dict[str, float]:
    text = generate_latest(build_registry(state)).decode()
    fam = next(f for f in text_string_to_metric_families(text) if f.name == spec.name)
    return {s.labels[label]: s.value for s in fam.samples if s.name.endswith("_total")}


def test_a_fresh_agent_serves_preemptions_and_slow_causes_at_zero() -> None:
    state = AgentState(AgentConfig(rings=["unused"], exposition=ExpositionConfig(model_name="m")))
    assert _counted(state, C.PREEMPTIONS, "reason") == {"recompute": 0.0, "swap": 0.0}
    assert _counted(state, C.SLOW, "cause") == {cause: 0.0 for cause in C.SLOW_CAUSES}


def test_the_first_preemption_counts_from_zero_and_the_other_reason_stays() -> None:
    state = AgentState(AgentConfig(rings=["unused"], exposition=ExpositionConfig(model_name="m")))
    state.counters[C.PREEMPTIONS.name].inc(("swap",))  # what the request ledger counts for a PREEMPTED event
    assert _counted(state, C.PREEMPTIONS, "reason") == {"recompute": 0.0, "swap": 1.0}
    assert state.counters[C.PREEMPTIONS.name].values == {("swap",): 1.0}  # the zeros are the exposition's only
