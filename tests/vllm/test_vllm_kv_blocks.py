"""The vLLM KV ledger (sources.vllm.kv_blocks) under repeats and floods: a BlockStored for a hash
already cached is another copy (vLLM does not de-duplicate its cache), each BlockRemoved drops one;
copies of a hash and ids of all hashes stay within their bounds, whatever a producer repeats, and
what the bounds let go is counted (issue 33 item 3). Expected rows and counts are written from
vLLM's semantics and counted from the input here. No vLLM needed.
"""
from __future__ import annotations

import time

from kv_fake_vllm import FakeVllm, pump, stored
from testkit import free_port

from infersight.agent.config import AgentConfig
from infersight.agent.state import AgentState
from infersight.correlate.frames import EventFrames
from infersight.runtime.observer import KVBlockEvent
from infersight.sources.vllm.kv_blocks import DEFAULT_MAX_COPIES, KVBlockLedger, KVRows
from infersight.sources.vllm.kv_events import VllmKVEventsConfig, VllmKVSubscriber
from infersight.sources.vllm.kv_metrics import VllmKVCollector
from infersight.sources.vllm.kv_remembered import EMPTY
from infersight.sources.vllm.kv_wire import BlockRemoved, BlockStored, KVBatch


def _batch(seq: int, *events: BlockStored | BlockRemoved) -> KVBatch:
    return KVBatch(seq, 0.0, 0, list(events))


def _rows(ledger: KVBlockLedger, *events: BlockStored | BlockRemoved) -> list[tuple[str, int, int]]:
    rows = KVRows()
    ledger.apply(_batch(0, *events), 0, rows)
    frame = rows.frame()
    return list(zip(frame["event"], frame["block_id"].tolist(), frame["block_hash"].tolist()))


def _ids_held(ledger: KVBlockLedger) -> int:
    """Ids in the table, counted slot by slot (not the table's own `used`)."""
    return sum(1 for c in ledger.blocks.copy if c != EMPTY)


def test_a_repeated_store_is_another_copy_and_each_removal_drops_the_newest() -> None:
    ledger = KVBlockLedger()
    assert _rows(ledger, BlockStored([7]), BlockStored([7])) == [("cached", 0, 7), ("cached", 1, 7)]
    assert ledger.cached_blocks == 2
    assert _rows(ledger, BlockRemoved([7])) == [("evicted", 1, 7)]
    assert _rows(ledger, BlockRemoved([7])) == [("evicted", 0, 7)]
    assert ledger.cached_blocks == 0
    assert _rows(ledger, BlockStored([7])) == [("recomputed", 0, 7), ("cached", 0, 7)]  # its old id back


def test_repeats_of_a_few_hashes_are_bounded_in_copies_and_counted() -> None:
    """2,000 stores of each of 50 hashes (no removal): each keeps at most DEFAULT_MAX_COPIES copies;
    the rest are counted, not kept; then every BlockRemoved is still one eviction."""
    ledger, repeats, hashes = KVBlockLedger(), 2_000, list(range(50))
    rows = KVRows()
    for seq in range(repeats):
        ledger.apply(_batch(seq, BlockStored(hashes)), seq, rows)
    kept = len(hashes) * min(repeats, DEFAULT_MAX_COPIES)
    assert rows.event.count(int(KVBlockEvent.CACHED)) == len(rows) == ledger.cached_blocks == kept
    assert _ids_held(ledger) == ledger.blocks.used == kept  # pre-fix: 100,000 ids, one a repeat
    assert ledger.dropped == {"copies": len(hashes) * repeats - kept, "forgotten_cached": 0, "forgotten": 0}
    rows = KVRows()
    for seq in range(repeats):
        ledger.apply(_batch(seq, BlockRemoved(hashes)), seq, rows)
    assert rows.event.count(int(KVBlockEvent.EVICTED)) == len(rows) == len(hashes) * repeats
    assert ledger.cached_blocks == 0
    assert _ids_held(ledger) == kept  # ids are remembered for the next store of each hash


def test_a_flood_of_distinct_hashes_stays_within_the_remembered_blocks() -> None:
    ledger = KVBlockLedger(remember_bytes=32 << 10, max_copies=4)  # 1,024 slots of 32 bytes, 3/4 used: 768 ids
    for seq in range(50):  # 5,000 distinct hashes, 100 a batch, never removed
        ledger.apply(_batch(seq, BlockStored(list(range(seq * 100, seq * 100 + 100)))), seq, KVRows())
        assert _ids_held(ledger) <= 768
    assert ledger.cached_blocks == 768
    assert ledger.dropped == {"copies": 0, "forgotten_cached": 5_000 - 768, "forgotten": 5_000 - 768}
    # A forgotten hash's removal is an eviction whose store was not seen: a new id; a remembered one keeps its own.
    (event, old_id, _), = _rows(ledger, BlockRemoved([4_999]))
    assert event == "evicted" and old_id == 4_999
    (event, new_id, _), = _rows(ledger, BlockRemoved([0]))
    assert event == "evicted" and new_id == 5_000 and _ids_held(ledger) == 768


def test_agent_memory_under_repeats_stays_what_is_kept() -> None:
    """Rounds of the issue's repeats through ledger and agent state: after the first round the
    ledger's ids and the fold's carried open events stop growing (pre-fix each round added 500,000
    of each), and nothing more is kept after the fourth round than after the first."""
    state, ledger = AgentState(AgentConfig(rings=["unused"])), KVBlockLedger()
    sizes, seq = [], 0
    for _ in range(4):
        for _ in range(20):  # 20 polls of 100 batches: 2,000 stores of each of 50 hashes a round
            rows = KVRows()
            for _ in range(100):
                ledger.apply(_batch(seq, BlockStored(list(range(50)))), seq * 1_000, rows)
                seq += 1
            state.ingest(EventFrames(kv_events=rows.frame()))
        sizes.append((_ids_held(ledger), len(state.kv.carry)))
    assert sizes == [(50 * DEFAULT_MAX_COPIES, 50 * DEFAULT_MAX_COPIES)] * 4


def test_the_subscriber_counts_what_its_ledger_let_go() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    # 512 bytes: 16 slots, 12 ids
    sub = VllmKVSubscriber(VllmKVEventsConfig(endpoint, remember_bytes=512, max_copies_per_hash=2),
                           wall_anchor=lambda: (0, 0))
    fake = FakeVllm(endpoint, None, sub)
    try:
        fake.publish(stored(1), stored(1), stored(1), ts=time.time())  # a third copy: over the bound
        fake.publish(stored(*range(10, 21)), ts=time.time())  # 11 more hashes: 1 and its 2 copies forgotten
        rows = pump(sub, fake, lambda r: len(r) >= 13)
        assert (rows["event"] == "cached").sum() == 2 + 11
        expected = {"copies": 1, "forgotten_cached": 2, "forgotten": 1}
        assert sub.stats()["ledger_dropped"] == expected
        family = next(f for f in VllmKVCollector(sub).collect() if f.name == "infersight_vllm_kv_ledger_dropped")
        assert {s.labels["reason"]: s.value for s in family.samples} == expected
    finally:
        sub.close()
        fake.close()
