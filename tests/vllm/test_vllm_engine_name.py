"""One vLLM engine is one `engine` label value: its API server's ring (writer.py) and its workers'
expert rings (experts.py) announce the same name, read back as the agent reads rings (RingSet). No
vLLM is started: the stat logger hands the writer its data-parallel rank (set_data_parallel_rank), and
the worker reads its rank from vLLM's current config, stood in for here by a module with the one
function the plugin calls (outside a config, vLLM asserts: the rank is then 0, checked too)."""
from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
from testkit import unique_ring

from infersight.agent.rings.ingest import RingSet
from infersight.probes.config import ProbeConfig
from infersight.probes.records import record_registry
from infersight.probes.ring import RingProducer
from infersight.vllm.engine_name import ENGINE_NAME_ENV, engine_name_problem, vllm_engine_name
from infersight.vllm.experts import EngineAnnouncer, current_dp_rank
from infersight.vllm.writer import VllmProbeSettings, VllmRingWriter


def _fake_vllm_config(monkeypatch: pytest.MonkeyPatch, dp_rank: int) -> None:
    """vllm.config.get_current_vllm_config, as a worker built with data-parallel rank dp_rank sees it."""
    config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(data_parallel_rank=dp_rank))
    module = types.ModuleType("vllm.config")
    module.get_current_vllm_config = lambda: config  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.config", module)


def _announced(names: list[str]) -> dict[str, str]:
    """Ring name -> the engine the agent takes it to belong to."""
    rings = RingSet(names, discover=False)
    try:
        rings.refresh()
        rings.read()
        return {name: ring.engine for name, ring in rings.attached.items()}
    finally:
        rings.close()


@pytest.fixture
def rings() -> Iterator[list]:
    made: list = []
    yield made
    for thing in made:
        thing.close()
        if isinstance(thing, RingProducer):
            thing.unlink()


@pytest.mark.parametrize(("env", "dp_rank", "expected"), [
    ({ENGINE_NAME_ENV: "chat-a"}, 0, "chat-a"), ({ENGINE_NAME_ENV: "chat-a"}, 2, "chat-a-dp2"),
    ({}, 0, "vllm"), ({}, 1, "vllm-dp1"), ({ENGINE_NAME_ENV: "two words"}, 0, "vllm")])
def test_server_and_worker_rings_announce_one_engine(monkeypatch: pytest.MonkeyPatch, rings: list,
                                                     env: dict[str, str], dp_rank: int, expected: str) -> None:
    server_ring, worker_ring = unique_ring("vllm-name-server"), unique_ring("vllm-name-worker")
    settings = VllmProbeSettings.from_env({**env, "INFERSIGHT_RING": server_ring}, 1234)
    writer = VllmRingWriter(settings)
    rings.append(writer)
    writer.set_data_parallel_rank(dp_rank)  # what the stat logger does with vllm_config.parallel_config
    writer.set_data_parallel_rank(dp_rank)  # a second engine index of the same process: no second suffix
    assert writer.open()
    _fake_vllm_config(monkeypatch, dp_rank)
    producer = RingProducer.create(worker_ring, 64, None, record_registry())
    rings.append(producer)
    # As ExpertLoadPlugin does: the rank read while the model is built, the name at the ring's creation.
    announcer = EngineAnnouncer(producer, vllm_engine_name(env, current_dp_rank()))
    produced = producer.stats()["produced"]
    announcer.maybe()  # not due again yet: nothing written
    assert producer.stats()["produced"] == produced == 1
    assert _announced([server_ring, worker_ring]) == {server_ring: expected, worker_ring: expected}
    assert (engine_name_problem(env) is not None) == (env.get(ENGINE_NAME_ENV) == "two words")


def test_no_current_config_is_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("vllm.config")

    def unset() -> None:
        raise AssertionError("Current vLLM config is not set.")  # what vLLM 0.32 raises

    module.get_current_vllm_config = unset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.config", module)
    assert current_dp_rank() == 0


def test_names_are_bounded_and_the_ring_name_needs_no_record(rings: list) -> None:
    assert vllm_engine_name({ENGINE_NAME_ENV: "x" * 32}, 12) == "x" * 27 + "-dp12"  # the suffix always fits
    ring = unique_ring("vllm-name-default")
    writer = VllmRingWriter(VllmProbeSettings(ProbeConfig(ring_name=ring, ring_capacity=64)))
    rings.append(writer)
    assert writer.open() and writer.engine_name == ring
    assert _announced([ring]) == {ring: ring}  # the agent's default: no ENGINE record needed
