"""The ring writer's heartbeat (infersight.probes.ring_heartbeat): an idle writer beats; a closed
ring says so; a writer in another pid namespace (simulated here by rewriting the ring's recorded
pid namespace, so that this reader cannot judge its pid; tests/deploy/test_two_containers.py does
it with real namespaces) is declared dead once its beats stop, its ring drained, removed and
counted; a new writer takes over a dead writer's ring name, and never a live one's.

Timings are read on the test's own clock; bounds are loose (a loaded 2-core machine).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from infersight.agent.rings.ingest import RingSet
from infersight.probes.control import control_name
from infersight.probes.records import RecordKind, record_dtype, record_registry, record_struct
from infersight.probes.ring import RingConsumer, RingProducer, RingWriterGone
from infersight.probes.ring_heartbeat import CLOSED, WRITER_BEAT, WRITER_BEAT_INTERVAL
from infersight.probes.ring_lease import WRITER_PIDNS

REPO = Path(__file__).resolve().parents[2]
GPU = record_struct(RecordKind.GPU)  # any registered kind; a GPU record's UUID is easy to read back
#: The test writers' beat: short for speed, long enough that a loaded machine does not starve a live
#: writer's beat thread for MISSED of them (at 0.1 s that happened once at load 21 on 2 cores).
INTERVAL_S = 0.3
MISSED = 5  # the reader's default (ring_heartbeat.DEFAULT_MISSED_BEATS), restated as the expectation


@pytest.fixture
def ring_name() -> Iterator[str]:
    name = f"infersight-test-beat-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    for leftover in (name, control_name(name)):
        if os.path.exists(f"/dev/shm/{leftover}"):
            os.unlink(f"/dev/shm/{leftover}")


def header_word(name: str, index: int) -> int:
    with open(f"/dev/shm/{name}", "rb") as f:
        return int.from_bytes(f.read(8 * (index + 1))[8 * index:], "little")


def set_header_word(name: str, index: int, value: int) -> None:
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
    try:
        os.pwrite(fd, value.to_bytes(8, "little"), 8 * index)
    finally:
        os.close(fd)


def gpu_record(index: int) -> bytes:
    return GPU.pack(time.monotonic_ns(), index, f"GPU-{index}".encode())


def writer_elsewhere(name: str, records: int) -> subprocess.Popen:
    """A writer process that writes `records` GPU records, then idles, beating every INTERVAL_S. Its
    ring is made to name a pid namespace that is not ours: this reader cannot judge its pid."""
    code = (f"import sys, time\nfrom infersight.probes.ring import RingProducer\n"
            f"from infersight.probes.records import RecordKind, record_registry, record_struct\n"
            f"p = RingProducer.create({name!r}, 64, None, record_registry(), beat_interval_s={INTERVAL_S})\n"
            f"s = record_struct(RecordKind.GPU)\n"
            f"for i in range({records}):\n    p.write(RecordKind.GPU, s.pack(time.monotonic_ns(), i, b'GPU-%d' % i))\n"
            f"print('ready', flush=True)\ntime.sleep(600)\n")
    # A session of its own: killed whole (its resource tracker too, which would unlink the ring), as a
    # container dies.
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO,
                             start_new_session=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    set_header_word(name, WRITER_PIDNS, 1)  # inode 1 is no pid namespace: "another one"
    return child


def test_an_idle_writer_beats_and_a_closed_ring_says_so(ring_name: str) -> None:
    prod = RingProducer.create(ring_name, 8, None, record_registry(), beat_interval_s=0.05)
    try:
        assert header_word(ring_name, WRITER_BEAT_INTERVAL) == 50_000_000
        first, t0 = header_word(ring_name, WRITER_BEAT), time.monotonic_ns()
        time.sleep(0.4)  # nothing written: the beats go on anyway
        later, t1 = header_word(ring_name, WRITER_BEAT), time.monotonic_ns()
        assert later > first and t1 - later < 0.3e9 and later - first > 0.15e9
    finally:
        prod.close()
    assert header_word(ring_name, WRITER_BEAT) == CLOSED
    prod.unlink()


def test_a_closed_ring_is_drained_then_left_without_counting_it_dead(ring_name: str) -> None:
    prod = RingProducer.create(ring_name, 8, None, record_registry(), beat_interval_s=0.05)
    rings = RingSet([ring_name], discover=False)
    try:
        rings.refresh()
        prod.write(RecordKind.GPU, gpu_record(0))
        prod.close()  # the ring's name stays: only the close marker tells the reader
        assert [r.name for r, _ in rings.read()] == [ring_name]  # its records first
        deadline = time.monotonic() + 10
        while ring_name in rings.attached and time.monotonic() < deadline:
            rings.read()
            time.sleep(0.1)
        assert ring_name not in rings.attached and rings.dead == 0
        assert not os.path.exists(f"/dev/shm/{ring_name}")  # the reader removed it
    finally:
        rings.close()


def test_a_writer_in_another_pid_namespace_is_dead_when_its_beats_stop(ring_name: str) -> None:
    child = writer_elsewhere(ring_name, 3)
    try:
        with RingConsumer.attach(ring_name, record_registry()) as cons:
            assert len(cons.read()[int(RecordKind.GPU)]) == 3
            quiet_until = time.monotonic() + MISSED * INTERVAL_S + 1.0  # idle over MISSED beats: beating, alive
            while time.monotonic() < quiet_until:
                assert cons.read() == {}
                time.sleep(0.05)
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            killed = time.monotonic()
            with pytest.raises(RingWriterGone, match="stopped beating") as gone:
                while time.monotonic() < killed + 10:
                    cons.read()
                    time.sleep(0.02)
            waited = time.monotonic() - killed
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert gone.value.dead
    # Not before MISSED beats (less the one interval the last beat may have preceded the kill by).
    assert (MISSED - 1) * INTERVAL_S <= waited < 10.0, waited
    assert not os.path.exists(f"/dev/shm/{ring_name}")


def test_a_restarted_writer_takes_a_dead_writers_name_and_gets_a_new_ring_index(ring_name: str) -> None:
    child = writer_elsewhere(ring_name, 2)
    rings = RingSet([ring_name], discover=False, retry_interval_s=0.1)
    try:
        rings.refresh()
        (first, frames), = rings.read()
        old_index = first.index
        os.killpg(child.pid, signal.SIGKILL)  # the engine container dies; its ring stays on /dev/shm
        child.wait()
        started = time.monotonic()
        # Its successor, in a fresh pid namespace, often gets the same pid, hence the same name: it waits
        # for the old ring's heartbeat to be over MISSED beats old, then replaces it.
        prod = RingProducer.create(ring_name, 64, None, record_registry(), beat_interval_s=INTERVAL_S)
        waited = time.monotonic() - started
        assert (MISSED - 1) * INTERVAL_S <= waited < 10.0, waited
        try:
            prod.write_many(RecordKind.GPU, np.frombuffer(b"".join(gpu_record(i) for i in (7, 8, 9)), record_dtype(RecordKind.GPU)))
            seen: list[int] = []
            deadline = time.monotonic() + 15
            while len(seen) < 3 and time.monotonic() < deadline:
                rings.refresh()
                for ring, frames in rings.read():
                    assert ring.index != old_index  # a new segment: request and step ids of their own
                    seen = sorted(ring.gpu_uuids)
                time.sleep(0.05)
            assert seen == ["GPU-7", "GPU-8", "GPU-9"]
            assert rings.dead == 1  # the old ring: its writer stopped beating
            assert os.path.exists(f"/dev/shm/{ring_name}")  # the reader removed the old ring, not the new
        finally:
            rings.close()
            prod.close()
            prod.unlink()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)


def test_a_live_writer_in_another_pid_namespace_keeps_its_name(ring_name: str) -> None:
    child = writer_elsewhere(ring_name, 0)
    try:
        started = time.monotonic()
        with pytest.raises(FileExistsError, match="live process in another pid namespace"):
            RingProducer.create(ring_name, 64, None, record_registry(), beat_interval_s=INTERVAL_S)
        assert time.monotonic() - started >= MISSED * INTERVAL_S  # it waited for the beats to stop
        with RingConsumer.attach(ring_name, record_registry(), lease=False) as peek:
            assert peek.header.producer_pid == child.pid  # still the live writer's ring
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
