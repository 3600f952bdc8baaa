"""The `engine` label on a tiny two-ring case: records written by hand into two rings (engine "alpha"
announced by an ENGINE record, the other ring announcing nothing: its ring name stands for it), read
and folded as the agent does. Expected counts are the records written here, per ring; a row released
after its own ring's batch (a served request whose NETWORK record never came, released when the
energy account closes) is counted under its own engine. A single-ring agent has no engine label."""
from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from testkit import unique_ring

import infersight.agent.state as state_module
from infersight.agent.api import report
from infersight.agent.config import AgentConfig
from infersight.agent.rings.engine_label_config import EngineLabelConfig
from infersight.agent.rings.engine_scope import RingEngine
from infersight.agent.rings.ingest import RingSet
from infersight.agent.state import AgentState
from infersight.commands import agent as agent_command
from infersight.config_error import ConfigError
from infersight.exporters import catalogue as C
from infersight.exporters.prometheus import build_registry
from infersight.probes.records import FinishReason, RecordKind, RequestEvent, engine_name_bytes, record_registry, record_struct
from infersight.probes.ring import RingProducer

REQ, SERVED, ENGINE = (record_struct(k).pack for k in (RecordKind.REQUEST, RecordKind.SERVED, RecordKind.ENGINE))


def _request(ring: RingProducer, rid: int, t0: int, prompt: int, output: int) -> None:
    """ARRIVED, SCHEDULED, FIRST_TOKEN, FINISHED (stop) of one request, 1 ms apart."""
    for i, (event, v0, reason) in enumerate(((RequestEvent.ARRIVED, prompt, 0), (RequestEvent.SCHEDULED, prompt, 0),
                                             (RequestEvent.FIRST_TOKEN, 0, 0),
                                             (RequestEvent.FINISHED, output, FinishReason.STOP))):
        ring.write(RecordKind.REQUEST, REQ(t0 + i * 1_000_000, 0, rid, 0, rid, v0, 0, 0, event, reason))


#: Per ring: (request id, prompt tokens, output tokens, served over HTTP: its row waits for NETWORK).
ALPHA = [(1, 5, 3, False), (2, 7, 4, False)]
OTHER = [(1, 11, 2, True), (2, 13, 6, False)]  # the same ids as alpha's: each ring's are its own


@pytest.fixture
def two_rings(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AgentState, str]]:
    # The other ring is read first, alpha's last: alpha is the engine in scope when the held row goes.
    names = [unique_ring("engine-b"), unique_ring("engine-a")]
    rings = [RingProducer.create(n, 64, None, record_registry()) for n in names]
    rings[1].write(RecordKind.ENGINE, ENGINE(0, engine_name_bytes("alpha")))
    for ring, requests in zip(rings, (OTHER, ALPHA)):
        for rid, prompt, output, served in requests:
            if served:
                ring.write(RecordKind.SERVED, SERVED(rid, 1, 0, 1.0, 1.0, 0, 0, 16, 1, 0))
            _request(ring, rid, 10_000_000 * rid, prompt, output)
    monkeypatch.setattr(state_module, "NETWORK_WAIT_S", 3600.0)  # the served row waits
    state = AgentState(AgentConfig(rings=names))
    reader = RingSet(names, discover=False)
    try:
        reader.refresh()
        for ring, frames in reader.read():
            state.ingest(frames, RingEngine(ring.index, ring.name, ring.engine))
        yield state, names[0]
    finally:
        reader.close()
        for ring in rings:
            ring.close()
            ring.unlink()


def _samples(state: AgentState, family: str) -> list[tuple[dict[str, str], float]]:
    text = generate_latest(build_registry(state)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return [(s.labels, s.value) for s in fams[family].samples if s.name.endswith("_total") or s.name == family]


def test_each_engine_counts_its_own_requests_and_a_late_row_its_own_engine(two_rings, monkeypatch) -> None:
    state, other = two_rings
    by_engine = lambda: {labels[-1]: v for labels, v in state.counters[C.REQUESTS.name].values.items()}  # noqa: E731
    # The served request of the other ring waits for its NETWORK record: not counted yet.
    assert by_engine() == {"alpha": len(ALPHA), other: sum(not served for *_, served in OTHER)}
    monkeypatch.setattr(state_module, "NETWORK_WAIT_S", 0.0)
    state.close_energy()  # no ring batch in scope: the row is released and counted under its own engine
    assert by_engine() == {"alpha": len(ALPHA), other: len(OTHER)}
    prompt = {labels[-1]: v for labels, v in state.counters[C.PROMPT_TOKENS.name].values.items()}
    assert prompt == {"alpha": sum(p for _, p, _, _ in ALPHA), other: sum(p for _, p, _, _ in OTHER)}
    output = {labels[-1]: v for labels, v in state.counters[C.GENERATION_TOKENS.name].values.items()}
    assert output == {"alpha": sum(o for _, _, o, _ in ALPHA), other: sum(o for _, _, o, _ in OTHER)}
    # TTFT observations: one per request, each engine its own series
    ttft = {labels[-1]: s.count for labels, s in state.histograms[C.TTFT.name].series.items()}
    assert ttft == {"alpha": len(ALPHA), other: len(OTHER)}


def test_the_exposition_labels_engine_families_only(two_rings) -> None:
    state, other = two_rings
    requests = _samples(state, "infersight_requests")
    assert {(s["engine"], s["finish_reason"]): v for s, v in requests} == {("alpha", "stop"): 2.0, (other, "stop"): 1.0}
    assert all(set(s) == {"task", "finish_reason", "engine", "model_name"} for s, _ in requests)
    # Each engine's zero series from its first batch; idle energy is the agent's as a whole.
    orphaned = _samples(state, "infersight_requests_orphaned")
    assert sorted((s["engine"], v) for s, v in orphaned) == [("alpha", 0.0), (other, 0.0)]
    # Idle energy counted the way EnergyAccount counts it (through the folds' view): no engine label.
    state.energy_account.counters[C.ENERGY_IDLE.name].inc((), 2.5)
    assert [(s, v) for s, v in _samples(state, "infersight_energy_idle_joules")] == [({"model_name": state.config.exposition.model_name}, 2.5)]
    probe = _samples(state, "infersight_probe_events")
    assert {s["engine"] for s, _ in probe} == set()  # ring_stats not set in this test: no series
    summary = report.summary(state)
    assert summary["requests"] == len(ALPHA) + len(OTHER) - 1  # the served one still waits
    assert {e: b["requests"] for e, b in summary["engines"].items()} == {"alpha": 2, other: 1}
    # TTFT of every request written here: FIRST_TOKEN 2 ms after ARRIVED
    assert {e: b["ttft_seconds"]["p50"] for e, b in summary["engines"].items()} == {"alpha": 0.002, other: 0.002}


def test_one_ring_has_no_engine_label_and_the_modes() -> None:
    name = unique_ring("engine-one")
    ring = RingProducer.create(name, 64, None, record_registry())
    ring.write(RecordKind.ENGINE, ENGINE(0, engine_name_bytes("alpha")))
    _request(ring, 1, 0, 5, 3)
    state, reader = AgentState(AgentConfig(rings=[name])), RingSet([name], discover=False)
    try:
        reader.refresh()
        for r, frames in reader.read():
            state.ingest(frames, RingEngine(r.index, r.name, r.engine))
        assert r.engine == "alpha"  # announced, but the label is off with one ring
    finally:
        reader.close()
        ring.close()
        ring.unlink()
    assert state.counters[C.REQUESTS.name].values == {("other", "stop"): 1.0}
    assert all("engine" not in s for s, _ in _samples(state, "infersight_requests"))
    assert "engines" not in report.summary(state)
    assert [EngineLabelConfig(m).enabled(1, False) for m in ("auto", "on", "off")] == [False, True, False]
    assert [EngineLabelConfig(m).enabled(1, True) for m in ("auto", "on", "off")] == [True, True, False]
    assert EngineLabelConfig("auto").enabled(2, False)
    with pytest.raises(ConfigError):
        EngineLabelConfig("sometimes")
    parser = argparse.ArgumentParser()
    agent_command.register(parser.add_subparsers())
    assert EngineLabelConfig.from_args(parser.parse_args(["agent", "--ring", "r"])) == EngineLabelConfig("auto")
    assert EngineLabelConfig.from_args(parser.parse_args(["agent", "--ring", "r", "--engine-label", "on"])).mode == "on"
