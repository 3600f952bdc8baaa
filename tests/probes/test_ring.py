"""Tests for the shared-memory probe ring (infersight.probes.ring / schema).

Expected values are computed from what the test wrote (or from a plain Python
model of a bounded FIFO), never from the ring's own counters.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import struct
import subprocess
import sys
import time
import uuid
from collections import deque
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from infersight.probes.ring import (
    ProbeRing, RingConsumer, RingFormatError, RingProducer, bench_ingest, list_rings,
)
from infersight.probes.schema import (
    LAYOUT_VERSION, RecordRegistry, RecordType, encode_header, plan_header,
)

REPO = Path(__file__).resolve().parents[2]

# Packed dtypes on purpose: itemsizes that are not multiples of 8.
STEP = RecordType(1, "token_step", 1, np.dtype([("ts_ns", "<u8"), ("step", "<i4"), ("latency_s", "<f8")]))
REQUEST = RecordType(2, "request", 3, np.dtype(
    [("trace_hi", "<u8"), ("trace_lo", "<u8"), ("trace_id", "S16"), ("prompt_tokens", "<u4")]))
KV = RecordType(3, "kv_blocks", 1, np.dtype([("blocks", "<u4", (8,)), ("util", "<f4"), ("flag", "?")]))
TYPES = [STEP, REQUEST, KV]


def steps(start: int, n: int) -> np.ndarray:
    """STEP records whose fields are all derived from the step number."""
    s = np.arange(start, start + n)
    out = np.zeros(n, STEP.dtype)
    out["ts_ns"], out["step"], out["latency_s"] = s * 3 + 1, s, s / 8
    return out


def assert_steps_consistent(recs: np.ndarray) -> None:
    """Every record is whole (no torn fields) and steps strictly increase."""
    s = recs["step"].astype(np.int64)
    assert np.array_equal(recs["ts_ns"], s * 3 + 1)
    assert np.array_equal(recs["latency_s"], s / 8)
    assert np.all(np.diff(s) > 0)


def poke(name: str, offset: int, fmt: str, value: int | bytes) -> None:
    """Overwrite bytes of a live ring, as a stray writer would."""
    raw = SharedMemory(name=name)
    struct.pack_into(fmt, raw.buf, offset, value)
    raw.close()


@pytest.fixture
def ring_name() -> Iterator[str]:
    name = f"infersight-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    if name in list_rings():  # a failed test must not leave a segment behind
        SharedMemory(name=name).unlink()


def test_round_trip_several_dtypes(ring_name: str) -> None:
    wall0, mono0 = time.time_ns(), time.monotonic_ns()
    st_recs = steps(0, 5)
    req = np.zeros(3, REQUEST.dtype)
    req["trace_hi"], req["trace_lo"] = [2**64 - 1, 7, 0], [1, 2**63, 42]
    req["trace_id"] = [bytes(range(16)), b"\xff" * 16, b"abc"]
    req["prompt_tokens"] = [1, 4096, 2**32 - 1]
    kv = np.zeros(4, KV.dtype)
    kv["blocks"] = np.arange(32).reshape(4, 8) * 1000
    kv["util"], kv["flag"] = [0.5, 1.25, -3.0, np.inf], [True, False, True, False]
    with ProbeRing.create(ring_name, 32, None, TYPES) as prod:
        wall1, mono1 = time.time_ns(), time.monotonic_ns()
        # Interleave kinds and every accepted input form.
        assert prod.write(1, st_recs[0])  # np.void
        assert prod.write(2, req[0:1])  # one-element array
        assert prod.write(3, kv[0].tobytes())  # bytes
        assert prod.write(1, st_recs[1:2])
        assert prod.write_many(3, kv[1:]) == 3
        assert prod.write(2, req[1])
        assert prod.write_many(1, st_recs[2:]) == 3
        assert prod.write(2, req[2].tobytes())
        with ProbeRing.attach(ring_name, TYPES) as cons:
            out = cons.read()
            assert sorted(out) == [1, 2, 3]
            for kind, expected in ((1, st_recs), (2, req), (3, kv)):
                assert out[kind].dtype == expected.dtype
                assert out[kind].tobytes() == expected.tobytes()  # exact bytes, in order
            assert out[2]["trace_hi"].tolist() == [2**64 - 1, 7, 0]
            assert out[2]["trace_id"][2] == b"abc"
            assert np.array_equal(out[3]["blocks"], kv["blocks"])
            assert cons.stats() == {"produced": 12, "written": 12, "dropped": 0, "consumed": 12,
                                    "corrupt": 0, "dropped_seen": 0, "backlog": 0, "capacity": 32,
                                    "reader_lost": 0, "in_flight": 12, "delivered_before": 0,
                                    "reader_pid": os.getpid()}
            wall, mono = cons.anchor
            assert wall0 <= wall <= wall1 and mono0 <= mono <= mono1
            assert cons.anchor == prod.anchor and cons.header.producer_pid == os.getpid()
            assert cons.to_wall_ns(mono + 1234) == wall + 1234
            assert cons.read() == {}


def test_overflow_drop_accounting_is_exact(ring_name: str) -> None:
    recs = steps(0, 20)
    with RingProducer.create(ring_name, 8, None, [STEP]) as prod:
        assert [prod.write(1, r) for r in recs] == [True] * 8 + [False] * 12
        pst = prod.stats()
        assert (pst["produced"], pst["written"], pst["dropped"], pst["backlog"]) == (20, 8, 12, 8)
        with RingConsumer.attach(ring_name, [STEP]) as cons:
            out = cons.read()
            assert out[1].tobytes() == recs[:8].tobytes()
            st = cons.stats()
            assert (st["produced"], st["consumed"], st["dropped"], st["corrupt"]) == (20, 8, 12, 0)
            assert st["produced"] == st["consumed"] + st["dropped"]
            assert cons.dropped_seen == prod.stats()["dropped"] == 12
            # Space is back and the sequence continues without a phantom gap.
            assert prod.write(1, recs[0]) and cons.read()[1].tobytes() == recs[0].tobytes()
            assert cons.dropped_seen == 12 and cons.stats()["produced"] == 21


def test_interleaved_writes_and_reads_match_model(ring_name: str) -> None:
    rng, cap = random.Random(1234), 8
    fifo: deque[tuple[int, int]] = deque()  # (event seq, step value) held by the ring
    drop_seqs: list[int] = []
    produced = consumed = nxt = 0
    with RingProducer.create(ring_name, cap, None, [STEP]) as prod, \
            RingConsumer.attach(ring_name, [STEP]) as cons:
        for _ in range(400):
            if rng.random() < 0.55:
                burst = rng.randint(1, 12)
                fits = min(burst, cap - len(fifo))
                if rng.random() < 0.5:
                    assert prod.write_many(1, steps(produced, burst)) == fits
                else:
                    oks = [prod.write(1, r) for r in steps(produced, burst)]
                    assert oks == [True] * fits + [False] * (burst - fits)
                fifo.extend((produced + i, produced + i) for i in range(fits))
                drop_seqs.extend(range(produced + fits, produced + burst))
                produced += burst
            else:
                limit = rng.choice([None, 1, 3, 5])
                taken = [fifo.popleft() for _ in range(len(fifo) if limit is None else min(limit, len(fifo)))]
                got = cons.read(limit)
                assert got.get(1, steps(0, 0))["step"].tolist() == [v for _, v in taken]
                consumed += len(taken)
                # Drops are seen up to the last consumed event, or up to `produced` once drained.
                nxt = produced if not fifo else (taken[-1][0] + 1 if taken else nxt)
                assert cons.dropped_seen == sum(1 for s in drop_seqs if s < nxt)
        assert cons.read(None).get(1, steps(0, 0))["step"].tolist() == [v for _, v in fifo]
        consumed += len(fifo)
        st = cons.stats()
        assert (st["produced"], st["consumed"], st["dropped"]) == (produced, consumed, len(drop_seqs))
        assert st["produced"] == st["consumed"] + st["dropped"] and len(drop_seqs) > 0
        assert cons.dropped_seen == len(drop_seqs) and st["corrupt"] == 0


def test_wrap_around_many_cycles(ring_name: str) -> None:
    cap, total, got = 16, 160, []
    bursts = [5, 16, 13, 1, 11, 16, 3]
    with RingProducer.create(ring_name, cap, 64, [STEP, KV]) as prod, \
            RingConsumer.attach(ring_name, [STEP, KV]) as cons:
        written, i = 0, 0
        while written < total:
            b = min(bursts[i % len(bursts)], total - written)
            recs = steps(written, b)
            if i % 2:
                assert prod.write_many(1, recs) == b
            else:
                assert all(prod.write(1, r) for r in recs)
            written, i = written + b, i + 1
            out = cons.read()
            got.extend(out[1]["step"].tolist())
            assert_steps_consistent(out[1])
        assert got == list(range(total))
        st = cons.stats()
        assert (st["produced"], st["written"], st["consumed"]) == (160, 160, 160)
        assert (st["dropped"], st["backlog"]) == (0, 0)
        # A batch that wraps and overflows: 16 free slots starting at slot 5.
        assert prod.write_many(1, steps(1000, 5)) == 5 and cons.read()[1]["step"][0] == 1000
        assert prod.write_many(1, steps(2000, 20)) == 16
        out = cons.read()[1]
        assert out["step"].tolist() == list(range(2000, 2016))
        assert cons.dropped_seen == 4 and cons.stats()["produced"] == 185


def test_consumer_restart_resumes_accounting(ring_name: str) -> None:
    with RingProducer.create(ring_name, 4, None, [STEP]) as prod:
        for r in steps(0, 7):
            prod.write(1, r)  # 4 written, 3 dropped
        with RingConsumer.attach(ring_name, [STEP]) as first:
            assert first.read(2)[1]["step"].tolist() == [0, 1]
        with RingConsumer.attach(ring_name, [STEP]) as second:
            assert second.read()[1]["step"].tolist() == [2, 3]
            st = second.stats()
            assert (st["consumed"], st["dropped_seen"], st["produced"]) == (4, 3, 7)


def test_bad_header_raises_ring_format_error(ring_name: str) -> None:
    with RingProducer.create(ring_name, 8, None, [STEP]) as prod:
        poke(ring_name, 0, "8s", b"NOTARING")
        with pytest.raises(RingFormatError, match="not an infersight probe ring: magic b'NOTARING'"):
            RingConsumer.attach(ring_name, [STEP])
        poke(ring_name, 0, "8s", b"ISPRING\x00")
        poke(ring_name, 8, "<I", LAYOUT_VERSION + 98)
        with pytest.raises(RingFormatError, match=f"layout version {LAYOUT_VERSION + 98} is not supported"):
            RingConsumer.attach(ring_name)
        poke(ring_name, 8, "<I", LAYOUT_VERSION)
        poke(ring_name, 16, "<I", 20)  # slot size that is not a multiple of 8
        with pytest.raises(RingFormatError, match="bad ring geometry"):
            RingConsumer.attach(ring_name)
        poke(ring_name, 16, "<I", prod.header.slot_size)
        with RingConsumer.attach(ring_name, [STEP]) as cons:  # restored: attaches fine
            assert cons.read() == {}


def test_reader_must_know_every_kind(ring_name: str) -> None:
    with RingProducer.create(ring_name, 8, None, [STEP, KV]):
        with pytest.raises(RingFormatError, match="kind 3 .'kv_blocks' v1., which this reader does not know"):
            RingConsumer.attach(ring_name, [STEP])
        newer = RecordType(1, "token_step", 2, STEP.dtype)
        expect = "is 'token_step' v1 .20 bytes. but this reader expects 'token_step' v2"
        with pytest.raises(RingFormatError, match=expect):
            RingConsumer.attach(ring_name, RecordRegistry([newer, KV]))


@pytest.mark.parametrize("size,capacity,match", [
    (100, 8, "region is 100 bytes, smaller than the 192-byte ring header"),
    (256 + 3 * 40, 64, "region is 376 bytes but the header describes 64 slots of 40 bytes"),
])
def test_truncated_region_raises(ring_name: str, size: int, capacity: int, match: str) -> None:
    raw = SharedMemory(name=ring_name, create=True, size=size)
    try:
        if size >= 256:
            header = plan_header(capacity, None, RecordRegistry([STEP]), 1, 2, 3)
            assert (header.slot_size, header.header_size, header.total_size) == (40, 256, 256 + 64 * 40)
            encode_header(raw.buf, header)  # a valid header over too few bytes
        with pytest.raises(RingFormatError, match=match) as exc:
            RingConsumer.attach(ring_name, [STEP])
        assert isinstance(exc.value, ValueError)
    finally:
        raw.close()
        # The attach took this name out of our resource tracker (see
        # RingProducer.unlink); put it back so unlink's unregister balances.
        resource_tracker.register("/" + ring_name, "shared_memory")
        raw.unlink()


def test_corrupt_slots_are_counted_and_skipped(ring_name: str) -> None:
    with RingProducer.create(ring_name, 16, None, [STEP]) as prod, \
            RingConsumer.attach(ring_name, [STEP]) as cons:
        for r in steps(0, 6):
            prod.write(1, r)
        poke(ring_name, prod.header.slot_offset(1) + 8, "<H", 999)  # unknown kind
        poke(ring_name, prod.header.slot_offset(3) + 12, "<I", 7)  # wrong payload length
        assert cons.read()[1]["step"].tolist() == [0, 2, 4, 5]
        st = cons.stats()
        assert (st["corrupt"], st["consumed"], st["dropped"], st["dropped_seen"]) == (2, 4, 0, 0)
        assert prod.write(1, steps(6, 1)) and cons.read()[1]["step"].tolist() == [6]
        for r in steps(7, 5):
            prod.write(1, r)
        poke(ring_name, prod.header.slot_offset(8), "<Q", 2**63 + 5)  # absurd jump
        poke(ring_name, prod.header.slot_offset(10), "<Q", 3)  # goes backwards
        assert cons.read()[1]["step"].tolist() == [7, 9, 11]
        st = cons.stats()
        assert (st["corrupt"], st["dropped_seen"]) == (4, 0)
        assert st["produced"] == st["consumed"] + st["dropped"] + st["corrupt"] == 12


def test_corrupt_seq_next_to_real_drops_keeps_gap_count_exact(ring_name: str) -> None:
    with RingProducer.create(ring_name, 4, None, [STEP]) as prod, \
            RingConsumer.attach(ring_name, [STEP]) as cons:
        assert [prod.write(1, r) for r in steps(0, 6)] == [True] * 4 + [False] * 2
        assert cons.read(2)[1]["step"].tolist() == [0, 1]
        assert prod.write_many(1, steps(6, 2)) == 2  # positions 4, 5 carry seqs 6, 7
        poke(ring_name, prod.header.slot_offset(4), "<Q", 123456)
        assert cons.read()[1]["step"].tolist() == [2, 3, 7]
        st = cons.stats()
        assert (st["corrupt"], st["dropped_seen"], st["dropped"], st["produced"]) == (1, 2, 2, 8)


def test_write_rejects_caller_bugs_without_taking_a_sequence_number(ring_name: str) -> None:
    with RingProducer.create(ring_name, 4, None, [STEP, KV]) as prod:
        with pytest.raises(KeyError, match="kind 9 is not registered"):
            prod.write(9, b"x" * 20)
        with pytest.raises(ValueError, match="records are 20 bytes, got 19"):
            prod.write(1, b"x" * 19)
        with pytest.raises(TypeError, match="expects dtype"):
            prod.write(1, np.zeros(1, KV.dtype))
        with pytest.raises(ValueError, match="batches: write_many"):
            prod.write(1, steps(0, 2))
        with pytest.raises(TypeError, match="expects dtype"):
            prod.write_many(3, steps(0, 2))
        assert prod.stats()["produced"] == 0
        with pytest.raises(ValueError, match="slot_size must be a multiple of 8, at least 56"):
            RingProducer.create(ring_name + "-x", 4, 48, [STEP, KV])


def test_list_rings_and_unlink(ring_name: str) -> None:
    prod = RingProducer.create(ring_name, 4, None, [STEP])
    assert ring_name in list_rings() and ring_name in list_rings("infersight-test-")
    assert ring_name not in list_rings("someone-else-")
    prod.close()
    prod.unlink()
    assert ring_name not in list_rings()
    with pytest.raises(FileNotFoundError):
        RingConsumer.attach(ring_name)


def _child_read(name: str, q: Any) -> None:
    with RingConsumer.attach(name, TYPES) as cons:
        out = cons.read()
        q.put(({k: v.tobytes() for k, v in out.items()}, cons.stats(), cons.anchor))


def test_consumer_in_spawned_process(ring_name: str) -> None:
    ctx = mp.get_context("spawn")
    kv = np.zeros(2, KV.dtype)
    kv["blocks"][1] = 9
    with RingProducer.create(ring_name, 8, None, TYPES) as prod:
        recs = steps(0, 10)
        assert prod.write_many(1, recs[:7]) == 7 and prod.write(3, kv[0]) and not prod.write(3, kv[1])
        q = ctx.Queue()
        p = ctx.Process(target=_child_read, args=(ring_name, q))
        p.start()
        got, st, anchor = q.get(timeout=60)
        p.join(60)
        assert p.exitcode == 0
        assert got == {1: recs[:7].tobytes(), 3: kv[:1].tobytes()}
        assert (st["produced"], st["consumed"], st["dropped"], st["dropped_seen"]) == (9, 8, 1, 1)
        assert anchor == prod.anchor
        assert ring_name in list_rings()  # the consumer's exit did not unlink the ring
        with RingConsumer.attach(ring_name, TYPES) as cons:
            assert cons.read() == {} and cons.stats()["consumed"] == 8


def _child_produce(name: str, n: int, ready: Any, done: Any, finished: Any) -> None:
    with RingProducer.create(name, 64, None, [STEP]) as prod:
        ready.set()
        recs = steps(0, n)
        for i in range(0, n, 100):
            for r in recs[i:i + 50]:
                prod.write(1, r)
            prod.write_many(1, recs[i + 50:i + 100])
            time.sleep(0)  # on a time-sliced box, let the reader in: overlap, not only drops
        done.set()
        finished.wait(60)  # the producer owns the segment: unlink only once the reader is done


def test_concurrent_producer_process(ring_name: str) -> None:
    ctx, n = mp.get_context("spawn"), 30000
    ready, done, finished = ctx.Event(), ctx.Event(), ctx.Event()
    p = ctx.Process(target=_child_produce, args=(ring_name, n, ready, done, finished))
    p.start()
    try:
        assert ready.wait(60)
        parts = []
        with RingConsumer.attach(ring_name, [STEP]) as cons:
            while not done.is_set():
                parts.append(cons.read().get(1, steps(0, 0)))
            parts.append(cons.read().get(1, steps(0, 0)))
            st = cons.stats()
        recs = np.concatenate(parts)
        assert_steps_consistent(recs)
        assert st["produced"] == n == st["consumed"] + st["dropped"] and st["corrupt"] == 0
        assert st["consumed"] == len(recs) and st["dropped_seen"] == st["dropped"]
        assert st["consumed"] > 64  # more than one ring's worth: reads overlapped the writes
    finally:
        finished.set()
        p.join(60)
    assert p.exitcode == 0 and ring_name not in list_rings()


def _run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_independent_consumer_process_leaves_ring_alone(ring_name: str) -> None:
    with RingProducer.create(ring_name, 8, None, [STEP]) as prod:
        prod.write_many(1, steps(0, 3))
        res = _run_python(
            "import sys\nfrom infersight.probes.ring import RingConsumer\n"
            "with RingConsumer.attach(sys.argv[1]) as c:\n"  # no registry: raw records
            "    out = c.read()\n    print(out[1].dtype, out[1].tobytes().hex())\n", ring_name)
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == ["|V20", steps(0, 3).tobytes().hex()]
        assert res.stderr == ""  # no resource_tracker "leaked shared_memory" warning
        assert ring_name in list_rings()  # and the consumer's exit did not unlink it


def test_same_process_producer_and_consumer_keep_tracker_quiet() -> None:
    res = _run_python(
        "import numpy as np\nfrom infersight.probes.ring import RingProducer, RingConsumer\n"
        "from infersight.probes.schema import RecordType\n"
        "rt = RecordType(1, 'x', 1, np.dtype([('a', '<u8')]))\n"
        "name = 'infersight-test-quiet-%d' % __import__('os').getpid()\n"
        "with RingProducer.create(name, 4, None, [rt]) as p, RingConsumer.attach(name, [rt]) as c:\n"
        "    p.write(1, b'12345678'); assert len(c.read()[1]) == 1\n")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # no KeyError traceback from the tracker, no leak warning


def test_bench_ingest_accounts_for_every_event() -> None:
    res = bench_ingest(20000, 256)
    assert res["produced"] == 20000 == res["consumed"] + res["dropped"]
    # Only the overflow phase drops: its last 5000 events go in bursts of 512
    # into an empty 256-slot ring, so each burst loses everything past 256.
    bursts = [512] * (5000 // 512) + [5000 % 512]
    dropped = sum(max(0, b - 256) for b in bursts)
    assert res["dropped"] == dropped and res["records_per_second"] > 0
    # One record a slot: the consumer handed out every record that was not dropped, and no more.
    assert res["records_read"] == 20000 - dropped and res["slots_per_second"] == res["records_per_second"]
