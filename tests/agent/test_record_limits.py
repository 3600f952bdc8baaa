"""The agent owns its limits: MoE layers / experts and task labels are capped by its config whatever
the producer sends, and what it refuses is counted exactly (infersight_probe_records_rejected_total)."""
from __future__ import annotations

import time

import numpy as np
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from testkit import unique_ring

from infersight.agent.api import report
from infersight.agent.config import AgentConfig, ConfigError
from infersight.agent.rings.limits_config import RecordLimits
from infersight.agent.service import Agent
from infersight.exporters import catalogue as C
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import RecordKind, RequestEvent, record_struct


@pytest.fixture
def pair():
    """A producer (probe observer, its own label cap set far above the agent's) and an agent on its ring."""
    made = []

    def make(**limits: int) -> tuple[ProbeObserver, Agent]:
        ring = unique_ring("limits")
        probe = ProbeObserver(ProbeConfig(ring_name=ring, ring_capacity=1 << 14, nvtx=False, max_task_labels=60_000))
        agent = Agent(AgentConfig(rings=[ring], port=0, limits=RecordLimits(**limits)))
        made.append((probe, agent))
        return probe, agent

    yield make
    for probe, agent in made:
        agent.close()
        probe.close()


def _rejected(agent: Agent) -> dict[str, float]:
    values = agent.state.counters[C.PROBE_REJECTED.name].values
    return {reason: n for (_, reason), n in values.items()}


def _moe(probe: ProbeObserver, step: int, layer: int, n_experts: int, counts: list[int], offset: int = 0) -> None:
    probe.ring.write(RecordKind.MOE, record_struct(RecordKind.MOE).pack(
        step, layer, offset, n_experts, *counts, *[0] * (64 - len(counts))))


def test_one_moe_record_at_layer_65535_is_refused_and_counted(pair) -> None:
    probe, agent = pair()
    _moe(probe, 1, 65535, 8, [1] * 8)          # the record: once a 32 GiB matrix
    _moe(probe, 1, 3, 8, [5, 0, 0, 0, 0, 0, 0, 2])
    _moe(probe, 2, 0, 65535, [7] * 64)           # experts over the limit
    _moe(probe, 2, 1, 8, [1] * 8, offset=64)     # offset past the layer's experts
    agent.poll_once()
    assert _rejected(agent) == {"moe_layer_over_limit": 1, "moe_experts_over_limit": 1, "moe_offset_out_of_range": 1}
    m = agent.state.expert_tokens
    assert m.shape == (4, 8)  # only the one good record shaped it
    assert m[3].tolist() == [5, 0, 0, 0, 0, 0, 0, 2] and int(m.sum()) == 7


def test_moe_limits_come_from_the_agent_config(pair) -> None:
    probe, agent = pair(max_moe_layers=2, max_moe_experts=16)
    for layer in range(4):
        _moe(probe, 1, layer, 16, [1] * 16)
    _moe(probe, 1, 0, 17, [1] * 17)
    agent.poll_once()
    assert _rejected(agent) == {"moe_layer_over_limit": 2, "moe_experts_over_limit": 1}
    assert agent.state.expert_tokens.shape == (2, 16)
    assert int(agent.state.expert_tokens.sum()) == 32


def test_2000_task_labels_give_at_most_the_agent_cap_of_series(pair) -> None:
    probe, agent = pair(max_task_labels=5)
    t = time.monotonic_ns()
    for rid in range(2000):
        probe.on_request_arrived(rid, t, 10, f"task-{rid}", 0)
        probe.on_request_scheduled(rid, t, 10, 0, 0)
    agent.poll_once()
    assert _rejected(agent) == {"task_label_over_limit": 1995}
    requests = agent.state.counters[C.PREFIX_REQUESTS.name].values
    # The first five labels announced are kept; every other request counts under "other".
    assert requests == {("task-0",): 1, ("task-1",): 1, ("task-2",): 1, ("task-3",): 1, ("task-4",): 1,
                        ("other",): 1995}
    text = generate_latest(agent.registry).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    got = {s.labels["reason"]: s.value for s in fams[C.PROBE_REJECTED.name].samples
           if s.name.endswith("_total")}
    assert got == {"task_label_over_limit": 1995.0}


def test_label_cap_is_shared_by_rings_and_id_zero_is_refused(pair) -> None:
    probe_a, agent = pair(max_task_labels=2)
    probe_a.on_request_arrived(1, 0, 1, "a", 0)
    probe_a.ring.write(RecordKind.TASK_LABEL, record_struct(RecordKind.TASK_LABEL).pack(0, b"sneaky"))
    agent.poll_once()
    screen = agent.rings.screen
    _, labels = screen.screen("second-ring", {int(RecordKind.TASK_LABEL): np.array(
        [(1, b"b"), (2, b"c"), (3, b"a")], dtype=[("task_id", "<u2"), ("label", "S32")])}, {})
    assert labels == {0: "other", 1: "b", 3: "a"}  # "a" is already one of the two; "c" would be a third
    assert screen.rejected == {(probe_a.ring_name, "task_label_id_zero"): 1,
                               ("second-ring", "task_label_over_limit"): 1}


def test_unknown_event_codes_are_refused_not_decoded(pair) -> None:
    probe, agent = pair()
    pack = record_struct(RecordKind.REQUEST).pack
    probe.ring.write(RecordKind.REQUEST, pack(1, 0, 7, 0, 0, 10, 0, 0, 200, 0))
    probe.ring.write(RecordKind.REQUEST, pack(1, 0, 7, 0, 0, 10, 0, 0, RequestEvent.ARRIVED, 0))
    agent.poll_once()
    assert _rejected(agent) == {"request_event_unknown": 1}
    assert agent.state.requests_seen == 1


def test_host_pauses_out_of_range_are_refused_and_the_rest_counted(pair) -> None:
    probe, agent = pair()
    pack = record_struct(RecordKind.HOST_PAUSE).pack
    for record in [(100, 50, 0, 0, 2),          # ends before it starts
                   (100, 200, 0, 0, 3),         # a generation Python does not have
                   (100, 200, 1 << 63, 0, 2),   # freed more objects than an int64 holds
                   (100, 4_000_100, 9, 0, 2), (5_000_000, 5_006_000, 3, 2, 0)]:
        probe.ring.write(RecordKind.HOST_PAUSE, pack(*record))
    agent.poll_once()
    assert _rejected(agent) == {"host_pause_out_of_range": 3}
    seconds = agent.state.counters[C.HOST_PAUSE_SECONDS.name].values
    pauses = agent.state.counters[C.HOST_PAUSES.name].values
    assert seconds == {("2",): pytest.approx(0.004), ("0",): pytest.approx(0.000006)}
    assert pauses == {("2",): 1, ("0",): 1, ("unknown",): 2}  # the 2 the producer could not keep
    block = report.summary(agent.state)["host_pauses"]
    assert block["pauses_by_generation"] == {"0": 1, "2": 1, "unknown": 2} and block["measured"] is True
    assert block["seconds_by_generation"] == {"0": pytest.approx(0.000006), "2": pytest.approx(0.004)}


@pytest.mark.parametrize("name", ["max_task_labels", "max_moe_layers", "max_moe_experts"])
def test_limits_must_be_positive(name: str) -> None:
    with pytest.raises(ConfigError, match="--" + name.replace("_", "-")):
        RecordLimits(**{name: 0})
