"""Expert parallelism on the shipped tiny-moe (4 layers, 8 experts, top-2) at W = 4 and at W = 3
(uneven home shards 2/3/3), gloo on CPU, against the single-process engine; then W = 4 again with
the agent's replication plan applied.

Each rank writes its own ring and exits; the test then reads the rings as the agent does (RingSet,
one batch per ring) into an AgentState, and checks its expert_parallel summary against plain
arithmetic over the raw records. Expected values come from the single-process engine's MOE
records, or from the other side of the exchange (what each rank routed vs what each received).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
from collections import defaultdict
from dataclasses import dataclass

import pandas as pd
import pytest

from ep_workers import ENGINE_KWARGS, PROMPTS, generate_runs_keeping_rings, generate_single
from gloo_spawn import spawn_local
from infersight.agent.config import AgentConfig
from infersight.agent.rings.ingest import RING_ID_SHIFT, RingSet
from infersight.agent.api.report import EP_SUMMARY_STEPS, expert_parallel
from infersight.agent.state import AgentState
from infersight.correlate.expert_parallel import plan_replication
from infersight.correlate.frames import EventFrames
from infersight.correlate.moe import expert_load
from infersight.probes.ring_discovery import remove_ring
from infersight.runtime.parallel.generation import GenerationSpec
from infersight.runtime.parallel.placement import LayerPlacement

SPEC = GenerationSpec("tiny-moe", PROMPTS[:6], max_tokens=12, engine_kwargs=ENGINE_KWARGS)
D_MODEL, N_LAYERS, N_EXPERTS = 256, 4, 8
EXTRA_REPLICAS = 2  # expert_parallel's default
_runs = itertools.count()


@dataclass
class SidecarView:
    """What the agent saw of one W-rank run: every ring's frames, by rank, and its state."""

    world: int
    tokens: list[list[list[int]]]  # per rank
    by_rank: dict[int, EventFrames]
    state: AgentState

    def merged(self, name: str) -> pd.DataFrame:
        return pd.concat([getattr(self.by_rank[r], name) for r in range(self.world)], ignore_index=True)


def _read_rings(world: int, results: list[tuple[list[list[int]], str]]) -> SidecarView:
    """Read every rank's ring as the agent does, into one AgentState; then remove the rings."""
    names = [name for _, name in results]
    rings = RingSet(names, discover=False)
    state = AgentState(AgentConfig(rings=names))
    by_rank = {r: EventFrames() for r in range(world)}
    try:
        rings.refresh()
        assert sorted(rings.attached) == sorted(names)
        while batches := rings.read():
            for ring, frames in batches:
                state.ingest(frames)
                rank = names.index(ring.name)
                by_rank[rank] = by_rank[rank].concat(frames)
    finally:
        rings.close()
        for name in names:
            remove_ring(name)
    return SidecarView(world, [t for t, _ in results], by_rank, state)


def _planned_replicas(moe: pd.DataFrame) -> dict[int, tuple[tuple[int, int], ...]]:
    """The replicas plan_replication proposes from the single-process expert loads (W = 4, 2 extra
    copies per layer: the agent's default); test_agent_summary_on_four_rings checks the agent
    proposes the same from the W = 4 records."""
    out = {}
    for layer, grp in expert_load(moe).groupby("layer"):
        plan = plan_replication(grp.sort_values("expert")["tokens"].to_numpy(), 4, EXTRA_REPLICAS)
        out[int(layer)] = plan.replicas
    return out


def _placements(replicas: dict[int, tuple[tuple[int, int], ...]]) -> dict[int, LayerPlacement]:
    return {layer: LayerPlacement.contiguous(N_EXPERTS, 4).with_replicas(r) for layer, r in replicas.items()}


@pytest.fixture(scope="module")
def reference():
    return generate_single(SPEC)


@pytest.fixture(scope="module")
def planned(reference):
    return _planned_replicas(reference.frames.moe)


@pytest.fixture(scope="module")
def views(planned):
    """Home W = 4, home W = 3 (the first three ranks) and W = 4 with the plan, in one spawn."""
    tag = f"{os.getpid()}-{next(_runs)}"
    runs = [(f"infersight-test-ep4-{tag}", 4, SPEC), (f"infersight-test-ep3-{tag}", 3, SPEC),
            (f"infersight-test-ep4p-{tag}", 4, dataclasses.replace(SPEC, placements=_placements(planned)))]
    per_rank = spawn_local(4, generate_runs_keeping_rings, runs, timeout_s=300)
    return {key: _read_rings(world, [r[i] for r in per_rank[:world]])
            for i, (key, world) in enumerate([("w4", 4), ("w3", 3), ("w4_plan", 4)])}


@pytest.fixture(scope="module")
def w4(views):
    return views["w4"]


@pytest.fixture(scope="module")
def w3(views):
    return views["w3"]


def _single_counts(moe: pd.DataFrame) -> pd.DataFrame:
    return moe.groupby(["step_id", "layer", "expert"], as_index=False)["tokens"].sum()


def _unshifted(moe: pd.DataFrame) -> pd.DataFrame:
    """The agent offsets each ring's step ids by its ring index; the ranks' steps are the same steps."""
    return moe.assign(step_id=moe["step_id"] & ((1 << RING_ID_SHIFT) - 1))


def _received(ep: pd.DataFrame) -> dict[tuple[int, int, int], int]:
    """(step, layer, expert) -> tokens the expert's copies received, from the raw tuple columns."""
    out: dict[tuple[int, int, int], int] = defaultdict(int)
    for row in ep.itertuples(index=False):
        for e, n in zip(row.expert_ids, row.expert_tokens):
            out[(row.step_id, row.layer, e)] += n
    return out


@pytest.mark.parametrize("view", ["w4", "w3"])
def test_tokens_identical_to_single_process(view, reference, request):
    run = request.getfixturevalue(view)
    assert all(len(t) == SPEC.max_tokens for t in reference.tokens)
    for rank_tokens in run.tokens:
        assert rank_tokens == reference.tokens


@pytest.mark.parametrize("view", ["w4", "w3"])
def test_rank_loads_sum_exactly_to_single_process_counts(view, reference, request):
    run = request.getfixturevalue(view)
    single = {(r.step_id, r.layer, r.expert): r.tokens for r in _single_counts(reference.frames.moe).itertuples()}
    got = _received(run.merged("ep"))
    assert sum(single.values()) > 0
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in single.items() if v}
    # what the ranks routed (each counts the pairs it sources) sums to the same, step by step
    routed = _single_counts(_unshifted(run.merged("moe")))
    pd.testing.assert_frame_equal(routed, _single_counts(reference.frames.moe))
    # the experts a rank received tokens for are its home shard: 8 experts over W ranks
    homes = {4: [{0, 1}, {2, 3}, {4, 5}, {6, 7}], 3: [{0, 1}, {2, 3, 4}, {5, 6, 7}]}[run.world]
    for rank, frames in run.by_rank.items():
        assert set(itertools.chain.from_iterable(frames.ep["expert_ids"])) == homes[rank]


@pytest.mark.parametrize("view", ["w4", "w3"])
def test_bytes_per_peer_are_pairs_times_a_float32_row(view, request):
    run = request.getfixturevalue(view)
    for rank, frames in run.by_rank.items():
        sent = frames.ep.assign(sent=[sum(b) for b in frames.ep["bytes_to_peer"]])
        assert set(map(len, frames.ep["bytes_to_peer"])) == {run.world}
        pairs = _unshifted(frames.moe).groupby(["step_id", "layer"])["tokens"].sum()
        want = pairs.loc[list(zip(sent["step_id"], sent["layer"]))].to_numpy() * D_MODEL * 4
        assert (sent["sent"].to_numpy() == want).all()


def test_agent_summary_on_four_rings(w4, planned):
    got = expert_parallel(w4.state)
    ep = w4.merged("ep")
    assert got["world"] == 4 and sorted(set(ep["rank"])) == [0, 1, 2, 3]
    want_share = (ep["dispatch_ns"].sum() + ep["combine_ns"].sum()) / ep["total_ns"].sum()
    assert got["a2a_share_of_moe_time"] == pytest.approx(want_share)
    # the straggler of each step: the rank with the most expert compute over the step's layers
    compute: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for row in ep.itertuples(index=False):
        compute[row.step_id][row.rank] += row.compute_ns
    assert len(got["straggler_by_step"]) == min(len(compute), EP_SUMMARY_STEPS)
    steps = sorted(compute)[-len(got["straggler_by_step"]):]
    want = [(s, max(range(4), key=lambda r: (compute[s][r], -r))) for s in steps]
    assert [(x["step_id"], x["rank"]) for x in got["straggler_by_step"]] == want
    tokens_by_rank = {r: sum(sum(t) for t in g["expert_tokens"]) for r, g in ep.groupby("rank")}
    assert {row["rank"]: row["tokens"] for row in got["ranks"]} == tokens_by_rank
    assert sum(row["straggler_steps"] for row in got["ranks"]) == len(compute)
    assert [p["layer"] for p in got["replication_plan"]] == list(range(N_LAYERS))
    # home placement: the measured balance is what the plan starts from
    for layer in got["replication_plan"]:
        loads = [sum(sum(t) for t in ep[(ep["layer"] == layer["layer"]) & (ep["rank"] == r)]["expert_tokens"])
                 for r in range(4)]
        assert layer["balance_measured"] == pytest.approx(max(loads) / (sum(loads) / 4))
        assert layer["balance_before"] == pytest.approx(layer["balance_measured"])
        assert [tuple(r) for r in layer["replicas"]] == list(planned[layer["layer"]])


def _round_robin_receipts(moe_by_rank: dict[int, pd.DataFrame], placements) -> dict[tuple[int, int, int], int]:
    """(step, layer, rank) -> tokens received, from what each source rank routed (its MOE records)
    and the dispatch rule: a layer's pairs for an expert with copies on ranks c_0 < c_1 < ..., numbered
    g = 0, 1, ... over the run (step by step; in a step, the sources' shards in rank order), go to
    c_{g mod copies}."""
    rows = sorted((row.step_id, source, row.layer, row.expert, row.tokens)
                  for source, moe in moe_by_rank.items() for row in _unshifted(moe).itertuples(index=False))
    out: dict[tuple[int, int, int], int] = defaultdict(int)
    seen: dict[tuple[int, int], int] = defaultdict(int)  # (layer, expert) -> pairs numbered so far
    for step, _, layer, expert, tokens in rows:
        copies = sorted(r for r, slots in enumerate(placements[layer].slots) if expert in slots)
        for g in range(seen[(layer, expert)], seen[(layer, expert)] + tokens):
            out[(step, layer, copies[g % len(copies)])] += 1
        seen[(layer, expert)] += tokens
    return out


def test_replication_plan_predicted_against_measured(w4, views, planned):
    run, placements = views["w4_plan"], _placements(planned)
    plan = expert_parallel(w4.state)["replication_plan"]  # predicted from the home run's records
    ep = run.merged("ep")
    received: dict[tuple[int, int, int], int] = defaultdict(int)
    for row in ep.itertuples(index=False):
        received[(row.step_id, row.layer, row.rank)] += sum(row.expert_tokens)
    want = _round_robin_receipts({r: f.moe for r, f in run.by_rank.items()}, placements)
    assert {k: v for k, v in received.items() if v} == {k: v for k, v in want.items() if v}
    got = expert_parallel(run.state)
    for layer, predicted in zip(got["replication_plan"], plan):
        loads = [sum(v for (s, lay, r), v in received.items() if lay == layer["layer"] and r == rank)
                 for rank in range(4)]
        assert layer["balance_measured"] == pytest.approx(max(loads) / (sum(loads) / 4))
        # same requests, same routing: the agent proposes the same plan from the replicated run
        assert layer["replicas"] == predicted["replicas"]
        assert layer["balance_after"] == pytest.approx(predicted["balance_after"])
    print("layer, balance home measured, plan predicted, plan measured:",
          [(p["layer"], round(p["balance_before"], 4), round(p["balance_after"], 4),
            round(m["balance_measured"], 4)) for p, m in zip(plan, got["replication_plan"])])
