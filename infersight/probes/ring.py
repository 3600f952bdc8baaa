"""Single-producer single-consumer ring of fixed-size probe records in shared memory: the layout,
the producer end, and the entry points (the consumer end is in ring_consumer.py).

One ring per producing process (named "infersight-<pid>" by convention)::

       0 +-------------------------------------------------------------+
         | magic "ISPRING\\0" | layout version | header size | slot size |
         | capacity | n types | producer pid | wall ns | monotonic ns  |
      48 | lease_pid | reader_lost          (reader: attach/takeover) |
      64 | write_pos | produced | dropped               (producer only) |
      88 | writer_start | writer_pidns           (producer, at create) |
     104 | writer_beat | beat_interval         (producer's heartbeat) |
     128 | read_pos | next_seq | consumed | corrupt | dropped_seen |    |
         | pending_bad | in_flight | lease_beat         (consumer only) |
     192 | type table: n x (kind u16, version u16, itemsize u32, name) |
       H +-------------------------------------------------------------+  H: 64-aligned
         | slot 0: seq u64 | kind u16 | rsv u16 | length u32 | record  |
         | ...  capacity slots of slot_size bytes                      |
         +-------------------------------------------------------------+

Every ``write`` is one *event* and takes the next event sequence number
(``produced``), whether it lands in a slot or is dropped because the ring is
full.  ``write_pos``/``read_pos`` count slots, so ``produced == write_pos +
dropped`` and the consumer counts drops exactly from sequence gaps.

Publication relies on CPython executing our stores in program order and on
x86-64 (TSO) making them visible to other cores in that order: the slot is
filled first and ``write_pos`` stored last, so a consumer that sees the new
``write_pos`` sees the whole slot.  Counters are 8-byte aligned u64s written
through a ``memoryview`` cast to "Q" (one aligned 8-byte store each), so they
are never torn.  Weakly ordered CPUs (ARM) would need fences this code lacks.

A ring has one reader, which holds its lease (ring_lease.py).  ``consumed``
counts records delivered; the last batch a reader took stays ``in_flight``
until it commits (or reads again), so when a reader dies its successor moves
that batch from ``consumed`` to ``reader_lost``: once a quiescent producer is
drained, ``produced == consumed + dropped + corrupt + reader_lost`` exactly,
across any number of reader deaths.  (A reader killed inside the few stores
that publish a batch can leave those counters torn: a microsecond window.)

The writer beats (ring_heartbeat.py) so that a reader in another pid namespace, which cannot
judge its pid, tells a dead writer's ring; a new writer that finds its name taken by a dead
writer's ring (a restarted container's engine often gets its predecessor's pid) replaces it.
"""

from __future__ import annotations

import logging
import os
import time
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Iterable

import numpy as np

from infersight.probes.ring_consumer import OLD_TRACKER, RingConsumer, RingWriterGone
from infersight.probes.ring_lease import SHM_DIR, LEASE_WORDS, RingLeaseError, read_ring_head, stamp_writer
from infersight.probes.ring_discovery import list_rings, pid_verdict, remove_ring, stale_ring, writer_state
from infersight.probes.ring_heartbeat import (
    DEFAULT_BEAT_INTERVAL_S, DEFAULT_MISSED_BEATS, WRITER_BEAT_INTERVAL, WriterBeat, WriterHeartbeat,
)
from infersight.probes.schema import (
    DROPPED, PRODUCED, READ_POS, SLOT_HEADER, SLOT_HEADER_SIZE, WRITE_POS, RecordRegistry, RecordType,
    RingFormatError, RingHeader, RingView, as_registry, encode_header, plan_header,
)

__all__ = ["ProbeRing", "RingProducer", "RingConsumer", "RingFormatError", "RingLeaseError", "RingWriterGone",
           "list_rings", "stale_ring", "remove_ring", "bench_ingest"]

_pack_slot_header = SLOT_HEADER.pack_into
log = logging.getLogger("infersight.probes")


class RingProducer(RingView):
    """Producer end: creates and owns (unlinks) the segment; ``write`` never blocks.

    ``next_seq`` (read it, never set it) is the sequence number the next event takes: the ring's
    ``produced`` count; write_slots' callers number their rows from it.
    """

    def __init__(self, shm: SharedMemory, header: RingHeader, registry: RecordRegistry,
                 beat_interval_s: float | None = DEFAULT_BEAT_INTERVAL_S) -> None:
        super().__init__(shm, header, {t.kind: t.dtype for t in registry})
        self._hw = shm.buf[:8 * LEASE_WORDS].cast("Q")
        # Beats until close, idle or not: a reader in another pid namespace judges us by it.
        self._heartbeat = None if beat_interval_s is None else WriterHeartbeat(self._hw, beat_interval_s)
        self.registry = registry
        self._specs = {t.kind: (t.dtype.itemsize, t.dtype) for t in registry}
        self._write_pos, self.next_seq, self._dropped = (self._pc[i] for i in (WRITE_POS, PRODUCED, DROPPED))
        # Cached first position that would be full: only on reaching it do we
        # re-read the consumer's read_pos, keeping the write path off its line.
        self._limit = self._cc[READ_POS] + self._capacity
        # write_slots: the last rows it was given, and their bytes.
        self._run: tuple = (None,)

    @classmethod
    def create(cls, name: str, capacity: int, slot_size: int | None,
               record_types: RecordRegistry | Iterable[RecordType],
               beat_interval_s: float | None = DEFAULT_BEAT_INTERVAL_S) -> RingProducer:
        """Create ring ``name`` with ``capacity`` slots (``slot_size=None``: fit the largest type).
        ``beat_interval_s``: the writer's heartbeat (None: no heartbeat, for rings read in-process).
        A ring of that name whose writer is dead is replaced (see replace_dead_ring)."""
        registry = as_registry(record_types)
        mono, wall = time.monotonic_ns(), time.time_ns()  # back to back: one anchor pair
        header = plan_header(capacity, slot_size, registry, os.getpid(), wall, mono)
        try:
            shm = SharedMemory(name=name, create=True, size=header.total_size)
        except FileExistsError:
            replace_dead_ring(name)
            shm = SharedMemory(name=name, create=True, size=header.total_size)
        encode_header(shm.buf, header)  # a new segment is zero-filled: every counter starts at 0
        # Who writes, once: a reader tells a dead writer's ring (or a reused pid) from a live one.
        stamp_writer(shm.buf)
        return cls(shm, header, registry, beat_interval_s)

    def close(self) -> None:
        """Stop the heartbeat (marking the ring closed: its reader stops at once) and unmap."""
        if not getattr(self, "_closed", True) and hasattr(self, "_hw"):
            if self._heartbeat is not None:
                self._heartbeat.stop()
            self._hw.release()
        super().close()

    def write(self, kind: int, record: np.ndarray | np.void | bytes) -> bool:
        """Append one record; on a full ring count it dropped and return False.

        Raises only for caller bugs (unregistered kind, wrong dtype or size),
        and then before taking a sequence number.
        """
        spec = self._specs.get(kind)
        if spec is None:
            raise KeyError(f"kind {kind} is not registered on ring {self.name!r}")
        if type(record) is bytes:
            data = record
        elif record.dtype is spec[1] or record.dtype == spec[1]:
            data = record.tobytes()
        else:
            raise TypeError(f"kind {kind} expects dtype {spec[1]}, got {record.dtype}")
        if len(data) != spec[0]:
            raise ValueError(f"kind {kind} records are {spec[0]} bytes, got {len(data)} (batches: write_many)")
        seq, pos, pc = self.next_seq, self._write_pos, self._pc
        self.next_seq = seq + 1
        if pos >= self._limit:
            self._limit = self._cc[READ_POS] + self._capacity
            if pos >= self._limit:
                self._dropped += 1
                pc[DROPPED] = self._dropped
                pc[PRODUCED] = seq + 1
                return False
        off = self._slot0 + (pos % self._capacity) * self._slot_size
        _pack_slot_header(self._buf, off, seq, kind, 0, spec[0])
        self._buf[off + SLOT_HEADER_SIZE:off + SLOT_HEADER_SIZE + spec[0]] = data
        self._write_pos = pos + 1
        pc[WRITE_POS] = pos + 1  # publish: stored after the slot contents
        pc[PRODUCED] = seq + 1  # after write_pos: RingConsumer.read relies on this order
        return True

    def write_many(self, kind: int, records: np.ndarray) -> int:
        """Write each record of a same-kind batch to its own slot, in order.

        Same outcome as one ``write`` per record: when the ring fills up the
        tail of the batch is dropped.  Returns how many were written.
        """
        spec = self._specs.get(kind)
        if spec is None:
            raise KeyError(f"kind {kind} is not registered on ring {self.name!r}")
        records = np.asarray(records).reshape(-1)
        if records.dtype != spec[1]:
            raise TypeError(f"kind {kind} expects dtype {spec[1]}, got {records.dtype}")
        n, cap, pos, seq0, pc = len(records), self._capacity, self._write_pos, self.next_seq, self._pc
        if pos + n > self._limit:
            self._limit = self._cc[READ_POS] + cap
        k = max(0, min(n, self._limit - pos))
        done = 0
        while done < k:  # at most two contiguous runs: before and after the wrap
            start = (pos + done) % cap
            m = min(k - done, cap - start)
            hdr = self._slot_hdr[start:start + m]
            hdr["seq"] = np.arange(seq0 + done, seq0 + done + m, dtype=np.uint64)
            hdr["kind"], hdr["length"] = kind, spec[0]
            self._payload[kind][start:start + m] = records[done:done + m]
            done += m
        self._write_pos = pc[WRITE_POS] = pos + k
        if k < n:
            self._dropped = pc[DROPPED] = self._dropped + n - k
        self.next_seq = pc[PRODUCED] = seq0 + n
        return k

    def write_slots(self, rows: np.ndarray) -> int:
        """Write whole slots built by the caller, one event each, in order, with one copy per run.

        ``rows`` is a C-contiguous (n, slot_size // 8) uint64 array, each row a slot: header and
        record (probes.step_block builds them), row i's seq word already ``next_seq + i`` (the
        caller packs it with the row's other words: cheaper than a pass here). Same outcome as one
        ``write`` per row: when the ring fills up the tail is dropped. Returns how many were
        written. The caller vouches for the seqs, kinds and lengths. Passing the same array object
        again (a writer's fixed staging rows) reuses its views.
        """
        if rows is not self._run[0]:
            if rows.shape[1] * 8 != self._slot_size:
                raise ValueError(f"rows of {rows.shape[1] * 8} bytes; the slots are {self._slot_size}")
            self._run = (rows, len(rows), memoryview(rows).cast("B"))
        _, n, raw = self._run
        pos, pc = self._write_pos, self._pc
        end, start = pos + n, pos % self._capacity
        if end <= self._limit and start + n <= self._capacity:  # the common case: room, before the wrap
            off = self._slot0 + start * self._slot_size
            self._buf[off:off + len(raw)] = raw
            self._write_pos = pc[WRITE_POS] = end  # publish: stored after the slot contents
            self.next_seq = pc[PRODUCED] = self.next_seq + n
            return n
        cap, seq0 = self._capacity, self.next_seq
        if pos + n > self._limit:
            self._limit = self._cc[READ_POS] + cap
        k = max(0, min(n, self._limit - pos))
        if k:
            # Whole slots, one memcpy: faster than copying each record's words alone (measured:
            # strided row copies stall on the cold ring lines; one large copy streams).
            size = self._slot_size
            off = self._slot0 + start * size
            m = min(k, cap - start)  # at most two contiguous runs: before and after the wrap
            self._buf[off:off + m * size] = raw[:m * size]
            if m < k:
                self._buf[self._slot0:self._slot0 + (k - m) * size] = raw[m * size:k * size]
        self._write_pos = pc[WRITE_POS] = pos + k  # publish: stored after the slot contents
        if k < n:
            self._dropped = pc[DROPPED] = self._dropped + n - k
        self.next_seq = pc[PRODUCED] = seq0 + n
        return k

    def unlink(self) -> None:
        """Remove the name; existing mappings (ours, consumers') stay valid."""
        if OLD_TRACKER:
            # The resource tracker keeps a *set* of names, and a consumer in this
            # process (or in a child sharing our tracker) removed ours when it
            # unregistered its attach.  Re-adding it keeps SharedMemory.unlink's
            # own unregister balanced, so the tracker prints no KeyError.
            resource_tracker.register("/" + self.name, "shared_memory")
        self._shm.unlink()

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.unlink()


def replace_dead_ring(name: str, missed: int = DEFAULT_MISSED_BEATS) -> None:
    """Ring ``name`` exists: remove it if its writer is dead, else raise FileExistsError.

    In a pod a restarted engine container has a new pid namespace in which the engine often gets
    its predecessor's pid, hence its ring name; the old ring, on the pod's /dev/shm, outlives it.
    A writer in this pid namespace is judged by pid at once; one in another by its heartbeat,
    waited for up to ``missed`` beats (a predecessor that has just died still looks alive)."""
    deadline = None
    while True:
        head = read_ring_head(name)
        if head is None and not os.path.exists(os.path.join(SHM_DIR, name)):
            return  # removed meanwhile (by its reader, or its writer's resource tracker)
        by_pid = None if head is None else pid_verdict(head)
        state = writer_state(name, missed)
        if state in (WriterBeat.DEAD, WriterBeat.CLOSED):
            log.warning("ring %r was left by a writer that is gone (%s); replacing it", name, state.value)
            remove_ring(name)
            return
        if state is not WriterBeat.ALIVE or by_pid is True:
            raise FileExistsError(f"ring {name!r} exists and its writer is not known to be gone "
                                  f"({'not a ring of this layout' if state is None else state.value}); "
                                  "give this engine another ring name")
        # Beating, in another pid namespace: dead only once its beats stop.
        if deadline is None:
            interval_s = _beat_interval_s(name) or DEFAULT_BEAT_INTERVAL_S
            deadline = time.monotonic() + (missed + 1) * interval_s
            log.info("ring %r exists, written by a process in another pid namespace; waiting up to %.0f s for "
                     "its heartbeat to stop", name, deadline - time.monotonic())
        if time.monotonic() > deadline:
            raise FileExistsError(f"ring {name!r} is written by a live process in another pid namespace (its "
                                  "heartbeat goes on); give this engine another ring name")
        time.sleep(0.2)


def _beat_interval_s(name: str) -> float:
    head = read_ring_head(name)
    return 0.0 if head is None else int(memoryview(head).cast("Q")[WRITER_BEAT_INTERVAL]) / 1e9


class ProbeRing:
    """Entry points: ``ProbeRing.create`` (producer) and ``ProbeRing.attach`` (consumer)."""

    create = staticmethod(RingProducer.create)
    attach = staticmethod(RingConsumer.attach)


def bench_ingest(n_records: int, capacity: int) -> dict[str, float]:
    """Push ``n_records`` through producer -> consumer in this process.

    Three quarters go in bursts of capacity/2, each drained at once (no drops);
    the rest in bursts of 2*capacity (overflow, given n_records/4 > capacity).
    Payloads are pre-encoded bytes: this times the ring, not record encoding.
    Each write is one record in one slot (a kind of its own, never batched), so
    records/s and slots/s are the same figure here, both measured: the records
    written (dropped ones too) over the elapsed time. produced / consumed / dropped are the ring's counters (slots);
    records_read is what the consumer handed out.
    """
    rt = RecordType(1, "bench", 1, np.dtype([("ts_ns", "<u8"), ("trace", "<u8", (2,)), ("value", "<f8")]))
    payloads = [np.array([(i, (i, i + 1), i / 2)], rt.dtype).tobytes() for i in range(64)]
    name = f"infersight-bench-{os.getpid()}-{time.monotonic_ns()}"
    with RingProducer.create(name, capacity, None, [rt]) as prod, RingConsumer.attach(name, [rt]) as cons:
        steady = n_records * 3 // 4
        t0 = time.perf_counter()
        for total, burst in ((steady, max(1, capacity // 2)), (n_records - steady, 2 * capacity)):
            while total > 0:
                for i in range(min(burst, total)):
                    prod.write(1, payloads[i & 63])
                total -= burst
                cons.read()
        elapsed = time.perf_counter() - t0
        st = cons.stats()
        records_read = cons.records_read
    return {"records_per_second": n_records / elapsed, "slots_per_second": n_records / elapsed,
            "records_read": records_read, "produced": st["produced"], "consumed": st["consumed"],
            "dropped": st["dropped"]}
