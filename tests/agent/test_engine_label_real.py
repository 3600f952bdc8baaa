"""The engine label end to end: two runtime engines with probes, each given its name
(ProbeConfig.engine_name, what `infersight serve --engine-name` sets), one agent reading both rings.
infersight_requests_total{engine=...} equals the requests the client sent each engine (its own count of
add_request calls), and the per-engine gauges come from each engine's own last step; an agent on one
ring serves no engine label. The serve flag's plumbing and its one-line refusal of a bad name are
checked through the CLI parser and ProbeConfig (no server is started)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pytest
from agent_workload import TINY, one_torch_thread, unique_ring
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from gpu_fakes import FakeGpuState, FakeNvml  # noqa: E402

from infersight.agent.config import AgentConfig
from infersight.agent.service import Agent
from infersight.commands import serve as serve_command
from infersight.exporters import catalogue as C
from infersight.gpu.nvml_collector import NvmlCollector
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig, SamplingParams

#: Engine name -> requests the client sends it (different, so a swap or a merge would show).
SENT = {"left": 3, "right": 5}


def _families(agent: Agent) -> dict[str, list]:
    text = generate_latest(agent.registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _engine(ring: str, name: str | None) -> tuple[Engine, ProbeObserver]:
    probe = ProbeObserver(ProbeConfig(ring_name=ring, nvtx=False, engine_name=name))
    return Engine(EngineConfig(model=TINY, num_kv_blocks=16, block_size=8), probe), probe


def _serve(engines: list[Engine], sent: list[int], agent: Agent, gpu: FakeGpuState | None = None) -> None:
    """Each engine its requests, stepped in turn until all finish, the agent polling after each round
    (with gpu: a GPU reading after each poll, the counter advanced by 300 W since the last one, so that
    finished rows wait for the next reading, which the agent takes in at the start of its next poll,
    before any ring's batch)."""
    last = [time.monotonic_ns()]

    def read_gpu() -> None:
        if gpu is not None:
            now = time.monotonic_ns()
            gpu.energy_mj += (now - last[0]) * 300 // 1_000_000
            last[0] = now
            agent.gpu.poll_once()

    read_gpu()  # the account starts before the first step
    with one_torch_thread():
        for engine, n in zip(engines, sent):
            for i in range(n):
                engine.add_request(f"request {i}", SamplingParams(max_tokens=4, ignore_eos=True, task="chat"))
        while any(e.has_unfinished() for e in engines):
            for e in engines:
                if e.has_unfinished():
                    e.step()
            agent.poll_once()  # the steps just run end after the last reading: their rows wait for the next
            read_gpu()
        agent.poll_once()  # the last reading: the rows still waiting are released by it


def test_two_named_engines_one_agent() -> None:
    """With a (fake) GPU energy counter, finished rows wait for their steps' energy and are released by
    the next reading, outside either ring's batch: each still counts under its own engine."""
    rings = [unique_ring("engine-left"), unique_ring("engine-right")]
    pairs = [_engine(ring, name) for ring, name in zip(rings, SENT)]
    gpu = FakeGpuState(uuid="GPU-fake-0", energy_mj=7_000_000_000)
    agent = Agent(AgentConfig(rings=rings, port=0), gpu_collector=NvmlCollector(FakeNvml([gpu]), gpm=False))
    try:
        _serve([e for e, _ in pairs], list(SENT.values()), agent, gpu)
        fams = _families(agent)
    finally:
        agent.close()
        for _, probe in pairs:
            probe.close()
    got: dict[str, float] = {}
    for s in fams[C.REQUESTS.name]:
        if s.name.endswith("_total"):
            got[s.labels["engine"]] = got.get(s.labels["engine"], 0.0) + s.value
    assert got == {name: float(n) for name, n in SENT.items()}
    # Preemptions per engine and reason from each engine's own request records; the reasons it did not
    # use are served at 0 (MetricSpec.zero_series), for each engine.
    want = {(name, reason): 0.0 for name in SENT for reason in ("recompute", "swap")}
    for (engine, _), name in zip(pairs, SENT):
        for req in engine.requests.values():
            for _, reason in req.times.preemptions:
                want[name, reason] += 1
    assert {(s.labels["engine"], s.labels["reason"]): s.value for s in fams[C.PREEMPTIONS.name]
            if s.name.endswith("_total")} == want
    # Gauges per engine (each engine's own last step); the probe counters' engine is their ring's.
    assert {s.labels["engine"] for s in fams[C.KV_USAGE.name]} == set(SENT)
    probe_events = {s.labels["ring"]: s.labels["engine"] for s in fams[C.PROBE_EVENTS.name]
                    if s.name.endswith("_total")}
    assert probe_events == dict(zip(rings, SENT))
    # Energy per engine (its requests' share); idle energy is the agent's, with no engine.
    assert {s.labels["engine"] for s in fams[C.ENERGY.name] if s.name.endswith("_total")} == set(SENT)
    assert [s.labels for s in fams[C.ENERGY_IDLE.name] if s.name.endswith("_total")] == [
        {"model_name": agent.config.exposition.model_name}]


def test_one_ring_no_engine_label() -> None:
    ring = unique_ring("engine-single")
    engine, probe = _engine(ring, "solo")
    agent = Agent(AgentConfig(rings=[ring], port=0))
    try:
        _serve([engine], [2], agent)
        fams = _families(agent)
    finally:
        agent.close()
        probe.close()
    totals = [s for s in fams[C.REQUESTS.name] if s.name.endswith("_total")]
    assert sum(s.value for s in totals) == 2 and all("engine" not in s.labels for s in totals)


def test_serve_engine_name_flag() -> None:
    parser = argparse.ArgumentParser()
    serve_command.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--engine-name", "left", "--ring", "r"])
    assert args.engine_name == "left"
    assert ProbeConfig(ring_name=args.ring, engine_name=args.engine_name).engine_name == "left"
    for bad in ("", "has space", "x" * 33, "caf\u00e9"):
        with pytest.raises(ValueError):
            ProbeConfig(ring_name="r", engine_name=bad)
