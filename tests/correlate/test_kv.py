"""transition_counts / block_states / block_lifetimes / recomputed_blocks on an event sequence
shaped like what KVBlockPool emits (tail-first release, FREED/CACHED only at ref count 0)."""
from __future__ import annotations

import pandas as pd
import pytest

from infersight.correlate.frames import KV_COLUMNS
from infersight.correlate.kv import block_lifetimes, block_states, recomputed_blocks, transition_counts

MS = 1_000_000


def kv(rows: list[tuple[int, str, int, int]]) -> pd.DataFrame:
    """rows: (ts_ms, event, block_id, request_id)."""
    return pd.DataFrame({"ts_ns": [r[0] * MS for r in rows], "event": [r[1] for r in rows],
                         "block_id": [r[2] for r in rows], "request_id": [r[3] for r in rows],
                         "block_hash": [0] * len(rows)}).astype(KV_COLUMNS)


EVENTS = kv([
    (1, "allocated", 0, 1), (2, "allocated", 1, 1), (3, "allocated", 2, 1),
    (10, "freed", 2, 1), (11, "cached", 1, 1), (12, "cached", 0, 1),       # r1 done, released tail-first
    (20, "prefix_hit", 0, 2), (21, "allocated", 3, 2), (22, "prefix_hit", 0, 3),
    (30, "offloaded", 3, 2), (30, "offloaded", 0, 2), (31, "freed", 3, 2),  # r2 swapped out; b0 still r3's
    (40, "evicted", 1, -1), (40, "allocated", 1, 2), (41, "reloaded", 1, 2),  # r2 swapped in on b1
    (45, "allocated", 4, 5), (46, "recomputed", 4, 5), (60, "cached", 4, 5),
    # b5 shared by r6 and r7; r6's release emits nothing, r7's emits CACHED: a "-1 per event"
    # replay would wrongly leave it in use.
    (70, "allocated", 5, 6), (71, "prefix_hit", 5, 7), (80, "cached", 5, 7),
])


def test_transition_counts_lists_every_event() -> None:
    # allocated: b0 b1 b2 (r1) + b3 + b1 again + b4 + b5 = 7; prefix_hit: b0 twice + b5 = 3;
    # cached: b1 b0 b4 b5 = 4.
    assert transition_counts(EVENTS) == {"allocated": 7, "prefix_hit": 3, "freed": 2, "cached": 4, "evicted": 1,
                                         "offloaded": 2, "reloaded": 1, "recomputed": 1, "resume_hit": 0}
    assert transition_counts(EVENTS.iloc[:0]) == {name: 0 for name in transition_counts(EVENTS)}


def test_block_states_after_replay() -> None:
    # b0 in use (r3), b1 in use (r2 reloaded), b2 freed, b3 freed, b4 cached, b5 cached, b6 never seen.
    assert block_states(EVENTS, 7) == {"free": 3, "in_use": 2, "cached": 2}
    # Up to t=22: b0 in use (hit twice), b1 cached, b2 freed, b3 in use; b4..b6 unseen.
    assert block_states(EVENTS[EVENTS.ts_ns <= 22 * MS], 7) == {"free": 4, "in_use": 2, "cached": 1}
    assert block_states(EVENTS.iloc[:0], 4) == {"free": 4, "in_use": 0, "cached": 0}


def test_block_lifetimes() -> None:
    out = block_lifetimes(EVENTS)
    assert list(out.columns) == ["block_id", "kind", "seconds"]
    # b0: cached 12 -> hit 20: reuse gap 8 (the hit at 22 follows a hit, not a CACHED).
    # b1: allocated 2 -> evicted 40: lifetime 38; cached 11 -> evicted 40: idle 29; reborn at 40 (open).
    # b2: 3 -> freed 10: 7.  b3: 21 -> freed 31: 10.  b4, b5: still alive (open, not reported).
    assert list(zip(out.block_id, out.kind)) == [(0, "reuse_gap"), (1, "lifetime"), (1, "idle_before_evict"),
                                                 (2, "lifetime"), (3, "lifetime")]
    assert list(out.seconds) == pytest.approx([0.008, 0.038, 0.029, 0.007, 0.010])


def test_block_lifetimes_frame_starting_mid_stream() -> None:
    # b9's birth precedes the frame: its first lifetime is unknown, the idle time is not.
    # b8 is born by a RELOADED (no ALLOCATED in the frame): 100 -> 130.
    out = block_lifetimes(kv([(5, "cached", 9, 1), (9, "evicted", 9, -1), (9, "allocated", 9, 2),
                              (15, "freed", 9, 2), (100, "reloaded", 8, 3), (130, "freed", 8, 3)]))
    assert list(zip(out.block_id, out.kind)) == [(8, "lifetime"), (9, "idle_before_evict"), (9, "lifetime")]
    assert list(out.seconds) == pytest.approx([0.030, 0.004, 0.006])
    empty = block_lifetimes(EVENTS.iloc[:0])
    assert empty.empty and empty.dtypes.equals(out.dtypes)


def test_recomputed_blocks() -> None:
    assert recomputed_blocks(EVENTS) == 1
    assert recomputed_blocks(EVENTS.iloc[:0]) == 0
