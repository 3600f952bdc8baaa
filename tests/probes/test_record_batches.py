"""BatchedKinds.expand (probes.record_batches) on tiny hand-made reads: batched records become the
per-record ones, in ring order.

The batched records are made here from the documented layouts with struct (not from the code's
dtypes), and the expected per-record records with the REQUEST / BATCH_MEMBER structs.
"""
from __future__ import annotations

import struct

import numpy as np

from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import RecordKind, batched_kinds, record_dtype, record_registry
from infersight.probes.ring import RingConsumer

REQUEST, MEMBER = struct.Struct("<qqQQQqqHBB"), struct.Struct("<QQI")
TOKENS_BATCH, MEMBERS_BATCH = struct.Struct("<7q7Q7Q7Q7I7HH"), struct.Struct("<Q21Q21IH")
R, B, T, M = (int(k) for k in (RecordKind.REQUEST, RecordKind.BATCH_MEMBER, RecordKind.TOKENS_BATCH,
                                RecordKind.MEMBERS_BATCH))
ARRIVED, TOKENS, FINISHED = 1, 5, 8
expand = batched_kinds().expand


def _tokens(*entries: tuple[int, int, int, int, int, int], count: int | None = None) -> bytes:
    """(ts, request id, trace hi, trace lo, tokens, task) entries, arrays zero-padded to 7."""
    cols = [list(c) + [0] * (7 - len(entries)) for c in zip(*entries)]
    return TOKENS_BATCH.pack(*(v for c in cols for v in c), len(entries) if count is None else count)


def _members(step: int, *members: tuple[int, int], count: int | None = None) -> bytes:
    rids, tokens = (list(c) + [0] * (21 - len(members)) for c in zip(*members))
    return MEMBERS_BATCH.pack(step, *rids, *tokens, len(members) if count is None else count)


def _array(kind: int, *records: bytes) -> np.ndarray:
    return np.frombuffer(b"".join(records), record_dtype(RecordKind(kind))).copy()


def test_tokens_interleave_with_the_request_records_by_ring_position() -> None:
    # ring order: ARRIVED(1) @0, TOKENS_BATCH [a, b] @1, TOKENS_BATCH [c] @3, FINISHED(2) @4; STEP @2 (not ours)
    a, b, c = (10, 1, 7, 8, 1, 3), (11, 2, 0, 9, 2, 0), (12, 1, 7, 8, 4, 3)
    records = {R: _array(R, REQUEST.pack(5, 0, 1, 7, 8, 100, 0, 3, ARRIVED, 0),
                         REQUEST.pack(13, 0, 2, 0, 9, 6, 0, 0, FINISHED, 1)),
               T: _array(T, _tokens(a, b), _tokens(c)), 2: np.zeros(1)}
    out, refused = expand(records, {R: np.array([0, 4]), T: np.array([1, 3]), 2: np.array([2])})
    want = [REQUEST.pack(5, 0, 1, 7, 8, 100, 0, 3, ARRIVED, 0)]
    want += [REQUEST.pack(ts, 0, rid, hi, lo, n, 0, task, TOKENS, 0) for ts, rid, hi, lo, n, task in (a, b, c)]
    want += [REQUEST.pack(13, 0, 2, 0, 9, 6, 0, 0, FINISHED, 1)]
    assert refused == 0 and sorted(out) == [R, 2]
    assert out[R].dtype == record_dtype(RecordKind.REQUEST) and out[R].tobytes() == b"".join(want)


def test_members_alone_and_after_per_record_members() -> None:
    members = [(100 + i, i % 3) for i in range(23)]  # 21 in the first record, 2 in the second
    out, refused = expand({M: _array(M, _members(4, *members[:21]), _members(4, *members[21:]))},
                          {M: np.array([0, 1])})
    assert refused == 0 and list(out) == [B]
    assert out[B].tobytes() == b"".join(MEMBER.pack(4, rid, n) for rid, n in members)
    # a step written record by record (a value that did not fit) before a batched one: ring order kept
    out, _ = expand({B: _array(B, MEMBER.pack(3, 9, 1)), M: _array(M, _members(4, (7, 2)))},
                    {B: np.array([5]), M: np.array([9])})
    assert out[B].tobytes() == MEMBER.pack(3, 9, 1) + MEMBER.pack(4, 7, 2)


def test_a_count_past_the_records_capacity_is_refused_and_an_empty_record_adds_nothing() -> None:
    records = {T: _array(T, _tokens((10, 1, 0, 0, 1, 0), count=8), _tokens((11, 2, 0, 0, 1, 0))),
               M: _array(M, _members(1, (5, 1), count=0))}
    out, refused = expand(records, {T: np.array([0, 1]), M: np.array([2])})
    assert refused == 1 and list(out) == [R]
    assert out[R].tobytes() == REQUEST.pack(11, 0, 2, 0, 0, 1, 0, 0, TOKENS, 0)
    untouched = {R: _array(R, REQUEST.pack(1, 0, 1, 0, 0, 1, 0, 0, ARRIVED, 0))}
    assert expand(untouched, {R: np.array([0])}) == (untouched, 0)


def test_a_refused_slot_is_counted_corrupt_by_the_reader() -> None:
    probe = ProbeObserver(ProbeConfig(nvtx=False, ring_name=f"infersight-rb-{id(object())}"))
    reader = RingConsumer.attach(probe.ring_name, record_registry())
    try:
        probe.ring.write(T, _tokens((10, 1, 0, 0, 1, 0), count=9))
        probe.ring.write(T, _tokens((11, 2, 0, 0, 3, 0)))
        got = reader.read()
        st = reader.stats()
        assert got[R]["ts_ns"].tolist() == [11] and got[R]["value0"].tolist() == [3]
        assert st["produced"] == 2 and st["consumed"] == 1 and st["corrupt"] == 1
    finally:
        reader.close()
        probe.close()
