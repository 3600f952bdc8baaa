"""A step's records written as one block of slots (probes.step_block) are the per-record path's.

Two observers get the same calls: one writes through StepBlock, the other is forced onto the
per-record path (one `ring.write` per record, values coerced). Every slot of both rings must be
equal, header and record bytes, and the ring counters too; the block-written kinds are also
checked against a naive encoder written here from the record layouts in the docs (one struct per
record, not the code under test).
"""
from __future__ import annotations

import itertools
import random
import struct

import pytest

from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.ring import RingConsumer
from infersight.runtime.stats import StepStats

_names = itertools.count()
_SLOT_HEADER = struct.Struct("<QHHI")  # seq, kind, reserved, length
# The naive encoder: kind -> little-endian layout, from the record tables (REQUEST, STEP, BATCH_MEMBER, STEP_TIMING).
_NAIVE = {1: struct.Struct("<qqQQQqqHBB"), 2: struct.Struct("<Qqq14I"), 3: struct.Struct("<QQI"),
          12: struct.Struct("<QqqqqqIIIIHB")}
_TOKENS = 5


def _observer(capacity: int, per_record: bool) -> ProbeObserver:
    obs = ProbeObserver(ProbeConfig(nvtx=False, ring_capacity=capacity,
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


class Twins:
    """The same calls to a block-writing observer and a per-record one; slots compared as they go."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.obs = [_observer(capacity, False), _observer(capacity, True)]
        self.readers = [RingConsumer.attach(o.ring_name) for o in self.obs]
        self.seen = 0  # ring positions compared so far
        self.steps: list[tuple[StepStats, list[tuple[int, int, int]]]] = []  # (stats, TOKENS) per step

    def __getattr__(self, name: str):
        def call(*args):
            for o in self.obs:
                getattr(o, name)(*args)
        return call

    def check(self, read: bool = True) -> None:
        """Both rings hold the same slots and counters; then drain them (unless read=False)."""
        written = [o.ring.stats()["written"] for o in self.obs]
        assert written[0] == written[1]
        first = max(self.seen, written[0] - self.capacity)
        a, b = (_slots(o, first, written[0]) for o in self.obs)
        assert a == b
        assert [seq for seq, *_ in a] == sorted(seq for seq, *_ in a)
        assert self.readers[0].stats() == {**self.readers[1].stats(), "reader_pid": self.readers[0].stats()["reader_pid"]}
        assert self.obs[0].encode_fixes == self.obs[1].encode_fixes
        self.seen = written[0]
        if read:
            for r in self.readers:
                r.read()

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
                      schedule_ns=rng.randrange(50), target_ns=rng.choice((-1, 400)), spec_probe=rng.random() < 0.2)
    tokens = [(1000 * step_id + 10 + i, rid, rng.choice((1, 1, 2))) for i, rid in enumerate(running)
              if rng.random() < 0.9]
    return stats, tokens


def test_random_steps_write_the_per_record_slots(twins) -> None:
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
        for ts, rid, n in tokens:
            t.on_tokens_emitted(rid, ts, n)
            if rng.random() < 0.03:  # finishes mid-step: its TOKENS must precede its FINISHED
                t.on_request_finished(rid, ts + 1, "stop", 9)
                running.remove(rid)
                stats.finished.append(rid)
        t.on_step_end(stats)
        t.check()
    assert next_id > 64 and t.seen > 10 * 300  # the staging grew; the ring wrapped


def test_a_full_ring_drops_the_same_tail(twins) -> None:
    t = twins(capacity=50)
    for rid in range(20):
        t.on_request_arrived(rid, 1, 5, None, rid)
    for step_id in range(1, 4):  # 20 + 2 + 20 slots a step: the second step fills the ring, the third drops
        for rid in range(20):
            t.on_tokens_emitted(rid, 100 * step_id + rid, 1)
        t.on_step_end(StepStats(step_id, 0, 0, batch=[(rid, 1) for rid in range(20)]))
        t.check(read=False)
    st = t.obs[0].ring.stats()
    assert st["dropped"] == 20 + 3 * 42 - 50 and st["produced"] == 20 + 3 * 42


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
    t.check()
    assert set(t.obs[0].encode_fixes) == {"REQUEST request_id: clamped", "STEP waiting: clamped",
                                          "BATCH_MEMBER num_tokens: clamped"}


def test_block_slots_match_a_naive_encoder(twins) -> None:
    t = twins()
    trace = (0xABCD << 64) | 0x1234
    t.on_request_arrived(7, 1, 5, "chat", trace)
    t.on_request_arrived(9, 2, 5, None, 5)
    t.check()
    for step_id in (1, 2, 3):  # the second and third steps reuse the rows the first one filled
        t.on_tokens_emitted(7, 100 + step_id, 1)
        t.on_tokens_emitted(9, 200 + step_id, step_id)
        t.on_tokens_emitted(11, 300 + step_id, 1)  # never arrived: zero trace and task
        stats = StepStats(step_id, 10, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, batch=[(7, 1), (9, 4)],
                          schedule_ns=13, draft_ns=14, draft_forwards=15, target_ns=16, spec_probe=True,
                          finished=[9])
        first = t.obs[0].ring.stats()["written"]
        t.on_step_end(stats)
        want = [(1, _NAIVE[1].pack(100 + step_id, 0, 7, 0xABCD, 0x1234, 1, 0, 1, _TOKENS, 0)),
                (1, _NAIVE[1].pack(200 + step_id, 0, 9, 0, 5, step_id, 0, 0, _TOKENS, 0)),
                (1, _NAIVE[1].pack(300 + step_id, 0, 11, 0, 0, 1, 0, 0, _TOKENS, 0)),
                (2, _NAIVE[2].pack(step_id, 10, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 2, 1)),
                (12, _NAIVE[12].pack(step_id, 10, 20, 13, 14, 16, 2, 1, 3, 4, 15, 1)),
                (3, _NAIVE[3].pack(step_id, 7, 1)), (3, _NAIVE[3].pack(step_id, 9, 4))]
        got = _slots(t.obs[0], first, first + len(want))
        assert [(kind, data) for _, kind, _, data in got] == want
        assert [length for _, _, length, _ in got] == [len(data) for _, data in want]
        assert [seq for seq, *_ in got] == list(range(got[0][0], got[0][0] + len(want)))
        t.check()


def test_a_request_that_arrives_after_its_rows_were_made_gets_its_trace(twins) -> None:
    """Rows are reused while the batch's ids stay the same: an arrival (or a finish) must still renew them."""
    t = twins()
    for step_id, arrive in ((1, False), (2, True), (3, False)):
        if arrive:
            t.on_request_arrived(11, 5, 5, "late", (7 << 64) | 8)
        t.on_tokens_emitted(11, 100 + step_id, 1)
        t.on_step_end(StepStats(step_id, 0, 0, batch=[(11, 1)]))
        t.check()
    t.on_request_finished(11, 200, "stop", 3)
    t.on_tokens_emitted(11, 201, 1)  # after its finish: the unknown request's zero trace and task again
    t.on_step_end(StepStats(4, 0, 0))
    t.check()
