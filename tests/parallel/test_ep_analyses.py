"""The EP_STATS record, its frame, the sidecar's merge of per-rank rings, and the analyses on
hand-built frames."""
from __future__ import annotations

import itertools
import math
import os

import pandas as pd
import pytest

from infersight.agent.rings.ingest import RingSet
from infersight.correlate import expert_parallel as epa
from infersight.correlate.frames import EP_COLUMNS, EventFrames
from infersight.exporters.parquet import FrameSink
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import RecordKind, record_dtype, record_registry
from infersight.probes.ring import RingConsumer

_ids = itertools.count()


def _frame(rows: list[tuple]) -> pd.DataFrame:
    """rows: (step, layer, rank, dispatch, compute, combine, gather, total, bytes, ids, tokens), world 2."""
    data = [(s, layer, r, 2, 0, d, c, m, g, t, b, i, k) for s, layer, r, d, c, m, g, t, b, i, k in rows]
    return pd.DataFrame(data, columns=list(EP_COLUMNS)).astype(
        {c: t for c, t in EP_COLUMNS.items() if t != "object"})


# Two ranks, two steps, one layer. Rank 0 hosts experts 0-1, rank 1 experts 2-3.
EP = _frame([
    (1, 0, 0, 100, 300, 100, 50, 600, (40, 60), (0, 1), (3, 2)),
    (1, 0, 1, 200, 100, 100, 50, 500, (50, 50), (2, 3), (1, 0)),
    (2, 0, 0, 100, 200, 100, 50, 500, (64, 64), (0, 1), (4, 4)),
    (2, 0, 1, 100, 400, 100, 50, 700, (64, 64), (2, 3), (1, 1)),
])


def _observer() -> tuple[ProbeObserver, RingConsumer]:
    obs = ProbeObserver(ProbeConfig(ring_name=f"infersight-test-epa-{os.getpid()}-{next(_ids)}"))
    return obs, RingConsumer.attach(obs.ring_name, record_registry())


def test_record_fits_the_existing_slot_size():
    assert record_dtype(RecordKind.EP_STATS).itemsize <= record_dtype(RecordKind.MOE).itemsize
    assert int(RecordKind.EP_STATS) == 20


def test_record_round_trip_with_chunks():
    """10 peers and 30 local experts spill into a second record; the analyses rejoin them."""
    obs, consumer = _observer()
    try:
        peers = [1000 * (p + 1) for p in range(10)]
        ids, tokens = list(range(30, 60)), list(range(100, 130))
        obs.on_ep_stats(7, 3, 4, 10, 11, 22, 33, peers, tokens, ids, gather_ns=44, total_ns=555)
        obs.on_ep_stats(8, 0, 1, 2, 1, 2, 3, [64, 128], [5, 6], [2, 3])
        records = consumer.read()
    finally:
        consumer.close()
        obs.close()
    ep = EventFrames.from_records(records, {}).ep
    assert ep["chunk"].tolist() == [0, 1, 0]
    first = ep.iloc[0]
    assert (first.step_id, first.layer, first["rank"], first.world) == (7, 3, 4, 10)
    phases = (first.dispatch_ns, first.combine_ns, first.compute_ns, first.gather_ns, first.total_ns)
    assert phases == (11, 22, 33, 44, 555)
    assert first.bytes_to_peer == tuple(peers[:8]) and ep.iloc[1].bytes_to_peer == tuple(peers[8:])
    assert ep.iloc[2].bytes_to_peer == (64, 128) and ep.iloc[2].expert_tokens == (5, 6)
    sent = epa.peer_bytes(ep)
    assert sent[sent["step_id"] == 7]["peer"].tolist() == list(range(10))
    assert sent[sent["step_id"] == 7]["bytes"].tolist() == peers
    toks = epa.expert_tokens(ep)
    step7 = toks[toks["step_id"] == 7]
    assert step7["slot"].tolist() == list(range(30))
    assert step7["expert"].tolist() == ids and step7["tokens"].tolist() == tokens
    timings = epa.a2a_share(ep, by=())
    assert timings["dispatch_s"].iloc[0] == pytest.approx(12e-9)  # chunk 1 does not count twice


def test_sidecar_merges_one_ring_per_rank(tmp_path):
    """Each rank writes its own ring; RingSet reads both and the ep frames concatenate."""
    runs = [_observer() for _ in range(2)]
    rings = RingSet([obs.ring_name for obs, _ in runs], discover=False)
    try:
        for rank, (obs, consumer) in enumerate(runs):
            consumer.close()
            obs.on_ep_stats(5, 0, rank, 2, 10, 20, 30 + rank, [64, 64], [3, 1], [2 * rank, 2 * rank + 1])
        rings.refresh()
        frames = EventFrames()
        for _, batch in rings.read():
            frames = frames.concat(batch)
        sink = FrameSink(tmp_path)  # the agent's --parquet-dir path takes the tuple columns too
        sink.write(frames)
        sink.close()
    finally:
        rings.close()
        for obs, _ in runs:
            obs.close()
    ep = frames.ep
    assert sorted(ep["rank"]) == [0, 1]
    assert set(ep["step_id"]) == {5}  # not shifted per ring: the ranks' steps line up
    assert epa.stragglers(ep)["straggler"].tolist() == [1]
    back = pd.read_parquet(tmp_path / "ep.parquet")
    assert [tuple(v) for v in back["expert_tokens"]] == [(3, 1), (3, 1)]


def test_peer_bytes_and_expert_tokens_long_format():
    sent = epa.peer_bytes(EP)
    assert sent.columns.tolist() == ["step_id", "layer", "rank", "peer", "bytes"]
    assert sent["bytes"].tolist() == [40, 60, 50, 50, 64, 64, 64, 64]
    assert sent["peer"].tolist() == [0, 1] * 4
    load = epa.expert_load(EP)
    assert load.to_dict("list") == {"layer": [0] * 4, "expert": [0, 1, 2, 3], "tokens": [7, 6, 2, 1]}


def test_a2a_share():
    share = epa.a2a_share(EP)
    row = share.iloc[0]
    # dispatch 500, compute 1000, combine 400, gather 200, total 2300 (ns)
    assert (row.dispatch_s, row.compute_s, row.combine_s, row.gather_s, row.moe_s) == pytest.approx(
        (500e-9, 1000e-9, 400e-9, 200e-9, 2300e-9))
    assert row.a2a_share == pytest.approx(900 / 2300)
    assert row.comm_share == pytest.approx(1100 / 2300)
    by_rank = epa.a2a_share(EP, by=("rank",))
    assert by_rank["a2a_share"].tolist() == pytest.approx([400 / 1100, 500 / 1200])
    with pytest.raises(ValueError):
        epa.a2a_share(EP, by=("step_id",))


def test_stragglers_and_hot_ranks():
    strag = epa.stragglers(EP)
    assert strag["straggler"].tolist() == [0, 1]
    assert strag["skew"].tolist() == pytest.approx([300 / 200, 400 / 300])
    hot = epa.hot_ranks(EP)
    # rank 0 received 3 + 2 + 4 + 4 = 13 tokens, rank 1 received 1 + 0 + 1 + 1 = 3: mean 8
    assert hot["tokens"].tolist() == [13, 3]
    assert hot["load_over_mean"].tolist() == pytest.approx([13 / 8, 3 / 8])
    assert hot["hot"].tolist() == [True, False]
    assert hot["straggler_steps"].tolist() == [1, 1] and hot["straggler_share"].tolist() == [0.5, 0.5]
    assert hot["compute_s"].tolist() == pytest.approx([500e-9, 500e-9])
    load = epa.rank_load(EP)
    assert load["tokens"].tolist() == [13, 3]


def test_replication_plans_per_layer():
    plans = epa.replication_plans(EP, extra_replicas=1)
    row = plans.iloc[0]
    # loads [7, 6, 2, 1]: rank 0 = 13, rank 1 = 3; expert 0 copied to rank 1: 3.5 + 6 vs 3.5 + 3
    assert (row.layer, row.world, row.n_experts, row.replicas_added) == (0, 2, 4, 1)
    assert row.replicas == ((0, 1),)
    assert row.balance_before == pytest.approx(13 / 8) and row.balance_after == pytest.approx(9.5 / 8)


def test_analyses_never_mutate_and_handle_empty():
    before = EP.copy(deep=True)
    for fn in (epa.peer_bytes, epa.expert_tokens, epa.expert_load, epa.a2a_share, epa.rank_load,
               epa.stragglers, epa.hot_ranks):
        fn(EP)
        out = fn(EventFrames().ep)
        assert out.empty
    epa.replication_plans(EP, 2)
    assert epa.replication_plans(EventFrames().ep, 2).empty
    pd.testing.assert_frame_equal(EP, before)
    assert math.isnan(epa.rank_load(_frame([(1, 0, 0, 1, 1, 1, 1, 4, (0, 0), (0, 1), (0, 0))]))
                      ["load_over_mean"].iloc[0])
