"""One reader per ring (infersight.probes.ring_lease): a second reader is refused naming the holder,
a dead reader's lease is taken over and its undelivered batch counted lost, a hung one's lease is
taken over after the timeout; a dead writer's ring is told from a live one, dropped and removed.

Expected values come from what the tests wrote and from what the child reader reported it read,
never from the ring's own counters alone.
"""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
import uuid
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from infersight.probes.control import ControlBlock, control_name
from infersight.probes.ring import (
    RingConsumer, RingFormatError, RingLeaseError, RingProducer, RingWriterGone, list_rings, stale_ring,
)
from infersight.probes.ring_lease import (
    LEASE_BEAT, LEASE_PID, READER_PIDNS, WRITER_START, lease_refusal, pid_namespace, process_start_ticks,
)
from infersight.probes.schema import LAYOUT_VERSION, RecordType

REPO = Path(__file__).resolve().parents[2]
STEP = RecordType(1, "token_step", 1, np.dtype([("ts_ns", "<u8"), ("step", "<u8"), ("n", "<u4")]))


def steps(start: int, n: int) -> np.ndarray:
    out = np.zeros(n, STEP.dtype)
    out["step"] = np.arange(start, start + n)
    return out


def poke(name: str, offset: int, fmt: str, value: object) -> None:
    raw = SharedMemory(name=name)
    struct.pack_into(fmt, raw.buf, offset, value)
    raw.close()


@pytest.fixture
def ring_name() -> Iterator[str]:
    name = f"infersight-test-lease-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    for leftover in (name, control_name(name)):
        if os.path.exists(f"/dev/shm/{leftover}"):
            os.unlink(f"/dev/shm/{leftover}")


def test_second_reader_is_refused_naming_the_holder(ring_name: str) -> None:
    with RingProducer.create(ring_name, 8, None, [STEP]) as prod:
        prod.write_many(1, steps(0, 3))
        with RingConsumer.attach(ring_name, [STEP]) as first:
            assert len(first.read()[1]) == 3
            with pytest.raises(RingLeaseError, match=rf"already read by agent pid {os.getpid()} \(last read "):
                RingConsumer.attach(ring_name, [STEP])
            assert f"agent pid {os.getpid()}" in (lease_refusal(ring_name) or "")
            assert first.read() == {}  # the refused attach took nothing from the holder
        assert lease_refusal(ring_name) is None  # a clean close gives the lease back
        with RingConsumer.attach(ring_name, [STEP]) as second:
            assert second.lease is not None and second.lease.took_over is None  # no takeover: released
            assert second.stats()["consumed"] == 3 and second.stats()["reader_lost"] == 0


def test_a_peek_without_the_lease_cannot_read(ring_name: str) -> None:
    with RingProducer.create(ring_name, 8, None, [STEP]), RingConsumer.attach(ring_name, [STEP]) as holder, \
            RingConsumer.attach(ring_name, [STEP], lease=False) as peek:
        assert peek.stats()["reader_pid"] == os.getpid()
        with pytest.raises(RingLeaseError, match="without the reader lease"):
            peek.read()
        assert holder.read() == {}


_CHILD = """
import sys, time
from infersight.probes.ring import RingConsumer
c = RingConsumer.attach(sys.argv[1])
a = c.read(int(sys.argv[2]))      # read again below: this batch is delivered
b = c.read(int(sys.argv[3]))      # never committed: the child is killed holding it
print(sum(len(v) for v in a.values()), sum(len(v) for v in b.values()), flush=True)
time.sleep(60)
"""


def test_dead_readers_lease_is_taken_over_and_its_batch_counted_lost(ring_name: str) -> None:
    with RingProducer.create(ring_name, 64, None, [STEP]) as prod:
        assert prod.write_many(1, steps(0, 20)) == 20
        child = subprocess.Popen([sys.executable, "-c", _CHILD, ring_name, "5", "7"], stdout=subprocess.PIPE,
                                 text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        try:
            delivered, taken = map(int, child.stdout.readline().split())
            assert (delivered, taken) == (5, 7)
            with pytest.raises(RingLeaseError, match=f"agent pid {child.pid}"):
                RingConsumer.attach(ring_name, [STEP])  # alive: refused
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
        for i in range(10):  # written while no reader read: kept in the ring, not lost
            prod.write(1, steps(100 + i, 1)[0])
        with RingConsumer.attach(ring_name, [STEP]) as cons:
            assert cons.lease.took_over is not None and cons.lease.took_over.pid == child.pid
            assert cons.lost_at_attach == 7 and cons.delivered_before == 5
            got = cons.read()[1]["step"].tolist()
            assert got == list(range(12, 20)) + list(range(100, 110))  # after the child's 12
            st = cons.stats()
        assert st["produced"] == 30 and (st["consumed"], st["reader_lost"], st["dropped_seen"]) == (5 + 18, 7, 0)
        assert st["produced"] == st["consumed"] + st["reader_lost"] + st["dropped_seen"] + st["corrupt"]


def test_events_dropped_while_no_reader_read_are_counted(ring_name: str) -> None:
    with RingProducer.create(ring_name, 8, None, [STEP]) as prod:
        with RingConsumer.attach(ring_name, [STEP]) as first:
            prod.write_many(1, steps(0, 4))
            assert len(first.read()[1]) == 4
        for i in range(30):  # nobody reads: 8 fit, 22 are dropped
            prod.write(1, steps(4 + i, 1)[0])
        with RingConsumer.attach(ring_name, [STEP]) as second:
            assert second.read()[1]["step"].tolist() == list(range(4, 12))
            st = second.stats()
        assert (st["produced"], st["consumed"], st["dropped"], st["dropped_seen"]) == (34, 12, 22, 22)


def test_hung_readers_lease_is_taken_over_after_the_timeout(ring_name: str) -> None:
    with RingProducer.create(ring_name, 8, None, [STEP]) as prod, RingConsumer.attach(ring_name, [STEP]) as hung:
        prod.write_many(1, steps(0, 2))
        assert len(hung.read()[1]) == 2
        with pytest.raises(RingLeaseError):
            RingConsumer.attach(ring_name, [STEP], lease_timeout_s=5.0)  # heartbeat fresh: refused
        poke(ring_name, 8 * LEASE_BEAT, "<Q", time.monotonic_ns() - 10**9)  # last read a second ago
        with RingConsumer.attach(ring_name, [STEP], lease_timeout_s=0.5) as successor:
            assert successor.lease.took_over.pid == os.getpid() and successor.lost_at_attach == 2
            with pytest.raises(RingLeaseError, match="took over this reader's lease"):
                hung.read()  # it notices, and stops, before taking anything
            prod.write_many(1, steps(2, 3))
            assert successor.read()[1]["step"].tolist() == [2, 3, 4]


def test_a_taker_of_a_hung_lease_takes_the_lock_once_it_is_free(ring_name: str) -> None:
    with RingProducer.create(ring_name, 8, None, [STEP]) as prod:
        hung = RingConsumer.attach(ring_name, [STEP])
        poke(ring_name, 8 * LEASE_BEAT, "<Q", time.monotonic_ns() - 10**9)
        with RingConsumer.attach(ring_name, [STEP], lease_timeout_s=0.5) as taker:
            assert taker.lease.took_over is not None
            prod.write_many(1, steps(0, 2))
            assert len(taker.read()[1]) == 2
            assert lease_refusal(ring_name) is not None  # the hung one's lock, and a fresh heartbeat
            hung.close()  # lets its lock go (the header names the taker: left as it is)
            time.sleep(1.1)
            taker.read()  # takes the lock at its next heartbeat
            # A reader from another pid namespace goes by the lock: held, so refused.
            poke(ring_name, 8 * READER_PIDNS, "<Q", 1)
            assert lease_refusal(ring_name) is not None


def test_a_holder_in_another_pid_namespace_is_judged_by_the_lock(ring_name: str) -> None:
    # A reader of another pid namespace died (its lock is free) naming pid 1, which in this namespace
    # is a live process (init), with a fresh heartbeat: as a pod's sidecar restarted in a new
    # namespace finds its predecessor. Its pid cannot be judged here: the free lock decides.
    with RingProducer.create(ring_name, 8, None, [STEP]):
        poke(ring_name, 8 * LEASE_PID, "<Q", 3 << 32 | 1)
        poke(ring_name, 8 * LEASE_BEAT, "<Q", time.monotonic_ns())
        poke(ring_name, 8 * READER_PIDNS, "<Q", pid_namespace())  # ours: pid 1 is judged, alive
        assert "agent pid 1" in (lease_refusal(ring_name) or "")
        poke(ring_name, 8 * READER_PIDNS, "<Q", 1)  # another namespace's
        assert lease_refusal(ring_name) is None
        with RingConsumer.attach(ring_name, [STEP]) as successor:
            assert successor.lease.took_over.pid == 1
            assert successor.stats()["reader_pid"] == os.getpid()


# before the lease; the batched TOKENS; a step's graph captures; the writer's heartbeat
@pytest.mark.parametrize("old", [1, 2, 3, 4])
def test_layout_version_mismatch_is_a_clear_error(ring_name: str, old: int) -> None:
    with RingProducer.create(ring_name, 8, None, [STEP]):
        poke(ring_name, 8, "<I", old)
        with pytest.raises(RingFormatError, match=f"layout version {old} is not supported .this reader understands "
                                                  f"version {LAYOUT_VERSION}.: the engine and the agent run "
                                                  "different infersight versions"):
            RingConsumer.attach(ring_name, [STEP])
    assert LAYOUT_VERSION == 5


def test_live_writer_and_reused_pid(ring_name: str) -> None:
    with RingProducer.create(ring_name, 8, None, [STEP]):
        assert not stale_ring(ring_name) and ring_name in list_rings("infersight-test-lease-")
        assert process_start_ticks(os.getpid()) is not None
        poke(ring_name, 8 * WRITER_START, "<Q", process_start_ticks(os.getpid()) + 1)  # "another process now"
        assert stale_ring(ring_name)
        assert ring_name not in list_rings("infersight-test-lease-")
        assert ring_name in list_rings("infersight-test-lease-", live_only=False)


_WRITER = """
import os, signal, sys
from multiprocessing import resource_tracker
import numpy as np
from infersight.probes.control import ControlBlock, control_name
from infersight.probes.ring import RingProducer
from infersight.probes.schema import RecordType
rt = RecordType(1, "token_step", 1, np.dtype([("ts_ns", "<u8"), ("step", "<u8"), ("n", "<u4")]))
p = RingProducer.create(sys.argv[1], 16, None, [rt])
ctl = ControlBlock(control_name(sys.argv[1]), create=True)
for name in (sys.argv[1], control_name(sys.argv[1])):  # as if the tracker died with the engine
    resource_tracker.unregister("/" + name, "shared_memory")
recs = np.zeros(6, rt.dtype); recs["step"] = range(6)
p.write_many(1, recs)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_dead_writers_ring_is_drained_dropped_and_removed(ring_name: str) -> None:
    res = subprocess.run([sys.executable, "-c", _WRITER, ring_name], env=dict(os.environ, PYTHONPATH=str(REPO)),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert os.path.exists(f"/dev/shm/{ring_name}") and os.path.exists(f"/dev/shm/{control_name(ring_name)}")
    assert stale_ring(ring_name)
    assert ring_name not in list_rings("infersight-test-lease-")  # discovery leaves it out
    with RingConsumer.attach(ring_name, [STEP]) as cons:  # named explicitly: its events are drained
        assert cons.read()[1]["step"].tolist() == list(range(6))
        deadline = time.monotonic() + 5
        with pytest.raises(RingWriterGone, match=r"its writer, pid \d+, has exited; drained and removed"):
            while time.monotonic() < deadline:
                assert cons.read() == {}
                time.sleep(0.05)
        assert cons.writer_gone and cons.stats()["consumed"] == 6
    assert not os.path.exists(f"/dev/shm/{ring_name}") and not os.path.exists(f"/dev/shm/{control_name(ring_name)}")


def test_commit_clears_the_in_flight_batch(ring_name: str) -> None:
    with RingProducer.create(ring_name, 8, None, [STEP]) as prod, RingConsumer.attach(ring_name, [STEP]) as cons:
        prod.write_many(1, steps(0, 3))
        cons.read()
        assert cons.stats()["in_flight"] == 3
        cons.commit()
        assert cons.stats()["in_flight"] == 0 and cons.stats()["consumed"] == 3
        ctl = ControlBlock(control_name(ring_name), create=True)
        ctl.close()  # not a ring: never judged stale
        assert not stale_ring(control_name(ring_name))
