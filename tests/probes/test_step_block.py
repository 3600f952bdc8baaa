"""A step's records written as one block of slots (probes.step_block) read as the per-record path's.

Two observers get the same calls: one writes through StepBlock (TOKENS and members batched many to
a slot), the other is forced onto the per-record path (one `ring.write` per record in the
per-record kinds, values coerced). What a reader decodes from both rings must be equal, kind by
kind and record by record, and so must the coerced-field counts; the batched slots are also checked
against a naive encoder written here from the record layouts in the docs (one struct per record,
not the code under test).
"""
from __future__ import annotations

import itertools
import random
import struct

import numpy as np
import pytest

from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import RecordKind, record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime.stats import StepStats

_names = itertools.count()
_SLOT_HEADER = struct.Struct("<QHHI")  # seq, kind, reserved, length
# The naive encoder: kind -> little-endian layout, from the record tables (REQUEST, STEP, BATCH_MEMBER,
# STEP_TIMING, and the batched TOKENS_BATCH (7 entries) and MEMBERS_BATCH (21 entries)).
_NAIVE = {1: struct.Struct("<qqQQQqqHBB"), 2: struct.Struct("<Qqq14I"), 3: struct.Struct("<QQI"),
          12: struct.Struct("<QqqqqqIIIIHBHBHBB"), 13: struct.Struct("<7q7Q7Q7Q7I7HH"), 14: struct.Struct("<Q21Q21IH")}
_TOKENS = 5


def _observer(capacity: int, per_record: bool) -> ProbeObserver:
    # Pauses not timed: a collection of this process would land in one twin's slots and not the other's.
    obs = ProbeObserver(ProbeConfig(nvtx=False, ring_capacity=capacity, host_pause_min_s=None,
                                    ring_name=f"infersight-sb-{next(_names)}-{id(object())}"))
    if per_record:
        obs._write_step = lambda stats: False  # the fallback: every record one write, coerced
        obs._block.write_tokens = lambda: False
    return obs


def _slots(obs: ProbeObserver, first: int, last: int) -> list[tuple[int, int, int, bytes]]:
    """(seq, kind, length, record bytes) of ring positions [first, last), parsed from the raw slots."""
    h, buf = obs.ring.header, obs.ring._buf  # the producer's own mapping of the segment
    out = []
    for pos in range(first, last):
        off = h.slot_offset(pos)
        seq, kind, _, length = _SLOT_HEADER.unpack_from(buf, off)
        out.append((seq, kind, length, bytes(buf[off + 16:off + 16 + length])))
    return out


def _same(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for kind in a:
        assert a[kind].dtype == b[kind].dtype and a[kind].tobytes() == b[kind].tobytes(), RecordKind(kind).name


class Twins:
    """The same calls to a block-writing observer and a per-record one; what they read back compared."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.obs = [_observer(capacity, False), _observer(capacity, True)]
        self.readers = [RingConsumer.attach(o.ring_name, record_registry()) for o in self.obs]
        self.read: list[dict[int, np.ndarray]] = []  # the block observer's last read

    def __getattr__(self, name: str):
        def call(*args):
            for o in self.obs:
                getattr(o, name)(*args)
        return call

    def check(self) -> None:
        """Both rings read back the same records and coerced the same fields; nothing dropped or corrupt."""
        a, b = (r.read() for r in self.readers)
        _same(a, b)
        assert self.obs[0].encode_fixes == self.obs[1].encode_fixes
        for r in self.readers:
            st = r.stats()
            assert st["dropped"] == st["corrupt"] == 0 and st["produced"] == st["consumed"]
        self.read = a

    def close(self) -> None:
        for r in self.readers:
            r.close()
        for o in self.obs:
            o.close()


@pytest.fixture
def twins():
    made: list[Twins] = []
    yield lambda capacity=1 << 12: made.append(Twins(capacity)) or made[-1]
    for t in made:
        t.close()


def _step(rng: random.Random, step_id: int, running: list[int]) -> tuple[StepStats, list[tuple[int, int, int]]]:
    batch = [(rid, rng.choice((1, 1, 1, 3, 17))) for rid in running]
    stats = StepStats(step_id, 1000 * step_id, 1000 * step_id + rng.randrange(900), rng.randrange(5), len(batch),
                      rng.randrange(3), rng.randrange(2), rng.randrange(100), rng.randrange(10), 128, 16,
                      rng.randrange(4), len(running), 0, rng.randrange(2), batch=batch,
                      schedule_ns=rng.randrange(50), target_ns=rng.choice((-1, 400)), spec_probe=rng.random() < 0.2,
                      graph_captures=rng.choice((0, 0, 0, 1)), profiled=rng.random() < 0.1,
                      kv_moves=rng.choice((0, 0, 0, 2)))
    tokens = [(1000 * step_id + 10 + i, rid, rng.choice((1, 1, 2))) for i, rid in enumerate(running)
              if rng.random() < 0.9]
    return stats, tokens


def test_random_steps_read_as_the_per_record_slots(twins) -> None:
    """Batches that grow past the staging rows (64), shrink, change members and finish requests
    mid-step (a FINISHED flushes the TOKENS before it); a small ring wraps many times."""
    t = twins(capacity=300)
    rng = random.Random(16)
    running: list[int] = []
    next_id = 0
    for step_id in range(1, 400):
        for _ in range(rng.choice((0, 0, 1, 3, 40 if step_id % 97 == 0 else 0))):
            t.on_request_arrived(next_id, 5 * step_id, 7, rng.choice((None, "chat", "code")),
                                 rng.getrandbits(128))
            running.append(next_id)
            next_id += 1
        stats, tokens = _step(rng, step_id, running)
        t.on_step_begin(step_id, stats.start_ns)
        held = rng.random() < 0.5  # as the engine: the ones that go on told at once, at one time
        for ts, rid, n in tokens:
            if held and rng.random() >= 0.03:
                continue
            t.on_tokens_emitted(rid, ts, n)
            if rng.random() < 0.03 or held:  # finishes mid-step: its TOKENS must precede its FINISHED
                t.on_request_finished(rid, ts + 1, "stop", 9)
                running.remove(rid)
                stats.finished.append(rid)
        if held:
            going = [(rid, n) for _, rid, n in tokens if rid in running]
            t.on_tokens_emitted_many([rid for rid, _ in going], 1000 * step_id + 999, [n for _, n in going])
            if rng.random() < 0.1:  # a single emission after the batch (another caller's order)
                t.on_tokens_emitted(10 ** 6, 1000 * step_id + 999, 1)
        t.on_step_end(stats)
        t.check()
    written = [o.ring.stats()["written"] for o in t.obs]
    assert next_id > 64 and written[0] > 3 * 300 and written[1] > 10 * 300  # the staging grew; the rings wrapped
    assert written[0] < written[1] / 3  # many TOKENS and members to a slot


def test_a_full_ring_drops_whole_slots_counted_once_each() -> None:
    """20 requests: a step is 3 TOKENS_BATCH slots (7+7+6), STEP, STEP_TIMING and one MEMBERS_BATCH (20)."""
    # Pauses not timed: a collection of this process would add a slot to the exact count.
    small = ProbeObserver(ProbeConfig(nvtx=False, ring_capacity=8, ring_name=f"infersight-sb-{next(_names)}-full",
                                      host_pause_min_s=None))
    reader = RingConsumer.attach(small.ring_name, record_registry())
    try:
        for rid in range(20):
            small.on_request_arrived(rid, 1, 5, None, rid)
            reader.read()
        for step_id in (1, 2):  # 6 slots a step: the second step's first 2 TOKENS slots fit, the rest drop
            for rid in range(20):
                small.on_tokens_emitted(rid, 100 * step_id + rid, 1)
            small.on_step_end(StepStats(step_id, 0, 0, batch=[(rid, 1) for rid in range(20)]))
        got = reader.read()
        st = reader.stats()
        assert st["produced"] == 20 + 2 * 6 and st["dropped"] == st["dropped_seen"] == 4
        assert st["consumed"] == 20 + 8 and st["corrupt"] == 0
        req = got[RecordKind.REQUEST]
        assert req["ts_ns"].tolist() == [100 + r for r in range(20)] + [200 + r for r in range(14)]
        assert got[RecordKind.STEP]["step_id"].tolist() == [1]
        assert got[RecordKind.BATCH_MEMBER]["request_id"].tolist() == list(range(20))
    finally:
        reader.close()
        small.close()


def test_values_out_of_range_take_the_coercing_path_with_the_same_counts(twins) -> None:
    t = twins()
    t.on_request_arrived(1, 1, 5, None, 3)
    t.on_tokens_emitted(1, 10, 1)
    t.on_tokens_emitted(2 ** 64, 11, 1)  # a request id past u64
    t.on_step_end(StepStats(1, 0, 0, batch=[(1, 1)]))
    t.on_tokens_emitted(1, 12, 1)
    t.on_step_end(StepStats(2, 0, 0, num_waiting=2 ** 40, batch=[(1, 1)]))  # a u32 count too large
    t.on_tokens_emitted(1, 13, 1)
    t.on_step_end(StepStats(3, 0, 0, batch=[(1, 2 ** 33)]))  # a member's token count too large
    t.on_tokens_emitted(1, 14, -2 ** 70)  # a TOKENS count past i64
    t.on_step_end(StepStats(4, 0, 0, batch=[(1, 1)]))
    t.check()
    assert set(t.obs[0].encode_fixes) == {"REQUEST request_id: clamped", "STEP waiting: clamped",
                                          "BATCH_MEMBER num_tokens: clamped", "REQUEST value0: clamped"}


def _tokens_slot(entries: list[tuple[int, int, int, int, int, int]]) -> bytes:
    """A TOKENS_BATCH record from (ts, request id, trace hi, trace lo, tokens, task) entries, arrays
    zero-padded to 7."""
    cols = [list(c) + [0] * (7 - len(entries)) for c in zip(*entries)]
    return _NAIVE[13].pack(*cols[0], *cols[1], *cols[2], *cols[3], *cols[4], *cols[5], len(entries))


def _members_slot(step_id: int, members: list[tuple[int, int]]) -> bytes:
    rids, tokens = (list(c) + [0] * (21 - len(members)) for c in zip(*members))
    return _NAIVE[14].pack(step_id, *rids, *tokens, len(members))


def test_block_slots_match_a_naive_encoder(twins) -> None:
    """Nine emitting requests (a full TOKENS_BATCH of 7 and one of 2), 23 members (21 + 2): the slots'
    bytes from the naive encoder, and what the reader decodes from the naive per-record records."""
    t = twins()
    trace = (0xABCD << 64) | 0x1234
    t.on_request_arrived(7, 1, 5, "chat", trace)
    t.on_request_arrived(9, 2, 5, None, 5)
    t.check()
    others = list(range(100, 107))  # never arrived: zero trace and task
    members = [(7, 1), (9, 4)] + [(200 + i, i) for i in range(21)]
    for step_id in (1, 2, 3, 4):  # the later steps reuse the rows the first one filled; the 4th is one held batch
        if step_id == 4:
            t.on_tokens_emitted_many([7, 9, *others], 400, [1, 4] + [1] * len(others))
        else:
            t.on_tokens_emitted(7, 100 + step_id, 1)
            t.on_tokens_emitted(9, 200 + step_id, step_id)
            for rid in others:
                t.on_tokens_emitted(rid, 300 + step_id, 1)
        stats = StepStats(step_id, 10, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, batch=members,
                          schedule_ns=13, draft_ns=14, draft_forwards=15, target_ns=16, spec_probe=True,
                          graph_captures=17, profiled=True, kv_moves=18, launched_ahead=False, launched_next=True,
                          finished=[9])
        first = t.obs[0].ring.stats()["written"]
        t.on_step_end(stats)
        ts7, ts9, ts_others = (400, 400, 400) if step_id == 4 else (100 + step_id, 200 + step_id, 300 + step_id)
        entries = [(ts7, 7, 0xABCD, 0x1234, 1, 1), (ts9, 9, 0, 5, step_id, 0)]
        entries += [(ts_others, rid, 0, 0, 1, 0) for rid in others]
        want = [(13, _tokens_slot(entries[:7])), (13, _tokens_slot(entries[7:])),
                (2, _NAIVE[2].pack(step_id, 10, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 23, 1)),
                (12, _NAIVE[12].pack(step_id, 10, 20, 13, 14, 16, 2, 1, 3, 4, 15, 1, 17, 1, 18, 0, 1)),
                (14, _members_slot(step_id, members[:21])), (14, _members_slot(step_id, members[21:]))]
        got = _slots(t.obs[0], first, first + len(want))
        assert [(kind, data) for _, kind, _, data in got] == want
        assert [length for _, _, length, _ in got] == [len(data) for _, data in want]
        assert [seq for seq, *_ in got] == list(range(got[0][0], got[0][0] + len(want)))
        assert t.obs[0].ring.stats()["written"] == first + len(want)
        t.check()
        # ... and read back as the records one write each stores (naive, independent of the twin).
        req = [_NAIVE[1].pack(ts, 0, rid, hi, lo, n, 0, task, _TOKENS, 0) for ts, rid, hi, lo, n, task in entries]
        assert t.read[RecordKind.REQUEST].tobytes() == b"".join(req)
        assert t.read[RecordKind.BATCH_MEMBER].tobytes() == b"".join(
            _NAIVE[3].pack(step_id, rid, n) for rid, n in members)


def test_a_request_that_arrives_after_its_rows_were_made_gets_its_trace(twins) -> None:
    """Rows are reused while the batch's ids stay the same: an arrival (or a finish) must still renew them."""
    t = twins()
    for step_id, arrive in ((1, False), (2, True), (3, False)):
        if arrive:
            t.on_request_arrived(11, 5, 5, "late", (7 << 64) | 8)
        t.on_tokens_emitted(11, 100 + step_id, 1)
        t.on_step_end(StepStats(step_id, 0, 0, batch=[(11, 1)]))
        t.check()
    assert t.read[RecordKind.REQUEST]["trace_lo"].tolist() == [8]
    t.on_request_finished(11, 200, "stop", 3)
    t.on_tokens_emitted(11, 201, 1)  # after its finish: the unknown request's zero trace and task again
    t.on_step_end(StepStats(4, 0, 0))
    t.check()
    assert t.read[RecordKind.REQUEST]["trace_lo"].tolist() == [8, 0]  # FINISHED, then the late TOKENS
