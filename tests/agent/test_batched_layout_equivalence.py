"""The batched ring layout (TOKENS and batch members many to a slot) gives the agent exactly what the
per-record layout gave: metrics, histograms, exemplars, summary and per-request rows.

One engine workload (tasks, prefix sharing, preemption, speculation) drives two ProbeObservers at
once: one writes the batched layout, the other is forced onto the per-record path (one record a
slot, the layout before batching). Each ring has its own agent, polled after every step. The rings
share one clock anchor and the observers one clock, so the only difference between them is the
layout. What may differ is only the ring's own accounting of its slots (probe events produced and
consumed: a batched slot is one event), which is left out of the comparison by name.
"""
from __future__ import annotations

import re
import time
import types

import pytest
from agent_workload import DRAFT, TINY, run_workload, unique_ring
from prometheus_client.openmetrics.exposition import generate_latest

import infersight.probes.observer as observer_module
import infersight.probes.ring as ring_module
from infersight.agent.api import report
from infersight.agent.config import AgentConfig
from infersight.agent.service import Agent
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig
from infersight.runtime.observer import EngineObserver

_EXEMPLAR_TIME = re.compile(r"(# \{[^}]*\} \S+) \S+$")
#: Ring accounting, in slots: the one thing the layouts are allowed to count differently; and each
#: agent's own time per poll (its clock, not the engine's data).
_SLOT_COUNTS = ("infersight_probe_events_total", "infersight_probe_events_created",
                "infersight_agent_poll_duration_seconds")


class Tee(EngineObserver):
    """Every engine callback to both observers, under one frozen clock (their own monotonic_ns reads agree)."""

    def __init__(self, first: ProbeObserver, second: ProbeObserver, clock: types.SimpleNamespace) -> None:
        self.observers, self.clock = (first, second), clock
        self.ranges, self.wants_expert_counts = first.ranges, first.wants_expert_counts

    def __getattribute__(self, name: str):
        if name.startswith("on_"):
            observers, clock = object.__getattribute__(self, "observers"), object.__getattribute__(self, "clock")

            def call(*args, **kwargs):
                clock.now = time.monotonic_ns()
                for o in observers:
                    getattr(o, name)(*args, **kwargs)
            return call
        return object.__getattribute__(self, name)


@pytest.fixture(scope="module")
def agents():
    mp = pytest.MonkeyPatch()
    clock = types.SimpleNamespace(now=time.monotonic_ns())
    mono, wall = time.monotonic_ns(), time.time_ns()
    mp.setattr(ring_module, "time", types.SimpleNamespace(monotonic_ns=lambda: mono, time_ns=lambda: wall))
    mp.setattr(observer_module, "time", types.SimpleNamespace(monotonic_ns=lambda: clock.now))
    names = [unique_ring("batched"), unique_ring("per-record")]
    # Pauses not timed: each observer's gc hook would time a collection with its own clock reads, microseconds
    # apart (CI read 0.200460 against 0.200484 s), and HOST_PAUSE records are not batched in either layout.
    batched, per_record = (ProbeObserver(ProbeConfig(ring_name=n, ring_capacity=1 << 16, nvtx=False,
                                                     host_pause_min_s=None)) for n in names)
    per_record._write_step = lambda stats: False  # the fallback: every record one write, as before batching
    per_record._block.write_tokens = lambda: False
    mp.setattr(ring_module, "time", time)  # the anchors are taken; the agents' clocks are their own
    engine = Engine(EngineConfig(model=TINY, speculative_model=DRAFT, num_kv_blocks=16, block_size=8,  # make_engine's
                                 cpu_offload_blocks=8, num_speculative_tokens=4, spec_probe_every=4),
                    Tee(batched, per_record, clock))
    pair = [Agent(AgentConfig(rings=[name], port=0)) for name in names]
    try:
        work = run_workload(engine, lambda: [a.poll_once() for a in pair])
        for a in pair:
            a.poll_once()
        yield work, pair, names, (batched, per_record)
    finally:
        for a in pair:
            a.close()
        batched.close()
        per_record.close()
        mp.undo()


def _exposition(agent: Agent, ring: str) -> list[str]:
    """The OpenMetrics lines, ring name replaced and each exemplar's timestamp (when this agent saw
    it: the two agents poll one after the other) cut; the slot counts and poll times left out."""
    text = generate_latest(agent.registry).decode().replace(ring, "RING")
    return [_EXEMPLAR_TIME.sub(r"\1", line) for line in text.splitlines() if not line.startswith(_SLOT_COUNTS)]


def test_the_layouts_really_differ(agents) -> None:
    _, pair, _, (batched, per_record) = agents
    produced = [o.ring.stats()["produced"] for o in (batched, per_record)]
    assert produced[0] < produced[1]  # fewer slots: the members batched (speculation flushes TOKENS one by one)
    for a in pair:
        st = next(iter(a.state.ring_stats.values()))
        assert st["dropped"] == st["corrupt"] == 0 and st["consumed"] == st["produced"]


def test_metrics_histograms_and_exemplars_are_identical(agents) -> None:
    _, pair, names, _ = agents
    got, want = (_exposition(a, n) for a, n in zip(pair, names))
    assert len(got) > 200 and any(" # {" in line for line in got)  # exemplars present
    assert got == want


def test_summary_and_request_rows_are_identical(agents) -> None:
    work, pair, _, _ = agents
    summaries = [{k: v for k, v in report.summary(a.state).items() if k != "rings"} for a in pair]
    assert summaries[0] == summaries[1]
    rows = [list(a.state.finished) for a in pair]
    assert len(rows[0]) == len(work.prompts)
    for got, want in zip(*rows):  # repr: NaN (no GPU: energy_j, gpu_*) equals NaN, and 1 is not 1.0
        assert got.keys() == want.keys() and {k: repr(v) for k, v in got.items()} == {
            k: repr(v) for k, v in want.items()}
