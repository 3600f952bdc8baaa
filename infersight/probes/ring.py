"""Single-producer single-consumer ring of fixed-size probe records in shared memory.

One ring per producing process (named "infersight-<pid>" by convention)::

       0 +-------------------------------------------------------------+
         | magic "ISPRING\\0" | layout version | header size | slot size |
         | capacity | n types | producer pid | wall ns | monotonic ns  |
      48 | lease_pid | reader_lost          (reader: attach/takeover) |
      64 | write_pos | produced | dropped               (producer only) |
      88 | writer_start | writer_pidns           (producer, at create) |
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
"""

from __future__ import annotations

import logging
import os
import sys
import time
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Iterable

import numpy as np

from infersight.probes.ring_lease import (
    DEFAULT_LEASE_TIMEOUT_S, IN_FLIGHT, LEASE_PID, LEASE_WORDS, READER_LOST, WRITER_PIDNS, WRITER_START,
    ReaderLease, RingLeaseError, process_start_ticks, stamp_writer, writer_alive,
)
from infersight.probes.ring_discovery import list_rings, remove_ring, stale_ring
from infersight.probes.schema import (
    CONSUMED, CORRUPT, DROPPED, DROPPED_SEEN, NEXT_SEQ, PENDING_BAD, PRODUCED, READ_POS, SLOT_HEADER,
    SLOT_HEADER_SIZE, WRITE_POS, RecordRegistry, RecordType, RingFormatError, RingHeader, RingView,
    as_registry, decode_header, encode_header, plan_header, resolve_dtypes,
)

__all__ = ["ProbeRing", "RingProducer", "RingConsumer", "RingFormatError", "RingLeaseError", "RingWriterGone",
           "list_rings", "stale_ring", "remove_ring", "bench_ingest"]

log = logging.getLogger("infersight.probes")
_pack_slot_header = SLOT_HEADER.pack_into
_OLD_TRACKER = os.name == "posix" and sys.version_info < (3, 13)  # attach registers with the tracker


class RingProducer(RingView):
    """Producer end: creates and owns (unlinks) the segment; ``write`` never blocks."""

    def __init__(self, shm: SharedMemory, header: RingHeader, registry: RecordRegistry) -> None:
        super().__init__(shm, header, {t.kind: t.dtype for t in registry})
        self.registry = registry
        self._specs = {t.kind: (t.dtype.itemsize, t.dtype) for t in registry}
        self._write_pos, self._produced, self._dropped = (self._pc[i] for i in (WRITE_POS, PRODUCED, DROPPED))
        # Cached first position that would be full: only on reaching it do we
        # re-read the consumer's read_pos, keeping the write path off its line.
        self._limit = self._cc[READ_POS] + self._capacity
        # write_slots: seq offsets 0, 1, ... and the views of the last rows it was given.
        self._seq_offsets = np.arange(256, dtype=np.uint64)
        self._run: tuple = (None,)

    @classmethod
    def create(cls, name: str, capacity: int, slot_size: int | None,
               record_types: RecordRegistry | Iterable[RecordType]) -> RingProducer:
        """Create ring ``name`` with ``capacity`` slots (``slot_size=None``: fit the largest type)."""
        registry = as_registry(record_types)
        mono, wall = time.monotonic_ns(), time.time_ns()  # back to back: one anchor pair
        header = plan_header(capacity, slot_size, registry, os.getpid(), wall, mono)
        shm = SharedMemory(name=name, create=True, size=header.total_size)
        encode_header(shm.buf, header)  # a new segment is zero-filled: every counter starts at 0
        # Who writes, once: a reader tells a dead writer's ring (or a reused pid) from a live one.
        stamp_writer(shm.buf)
        return cls(shm, header, registry)

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
        seq, pos, pc = self._produced, self._write_pos, self._pc
        self._produced = seq + 1
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
        n, cap, pos, seq0, pc = len(records), self._capacity, self._write_pos, self._produced, self._pc
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
        self._produced = pc[PRODUCED] = seq0 + n
        return k

    def write_slots(self, rows: np.ndarray) -> int:
        """Write whole slots built by the caller, one event each, in order, with one copy per run.

        ``rows`` is a C-contiguous (n, slot_size // 8) uint64 array, each row a slot: header and
        record (probes.step_block builds them). This sets each row's seq word, in place. Same
        outcome as one ``write`` per row: when the ring fills up the tail is dropped. Returns how
        many were written. The caller vouches for the kinds and lengths. Passing the same array
        object again (a writer's fixed staging rows) reuses its views.
        """
        if rows is not self._run[0]:
            n = len(rows)
            if rows.shape[1] * 8 != self._slot_size:
                raise ValueError(f"rows of {rows.shape[1] * 8} bytes; the slots are {self._slot_size}")
            if len(self._seq_offsets) < n:
                self._seq_offsets = np.arange(2 * n, dtype=np.uint64)
            self._run = (rows, rows[:, 0], self._seq_offsets[:n], memoryview(rows).cast("B"))
        _, seq_words, offsets, raw = self._run
        n, cap, pos, seq0, pc = len(offsets), self._capacity, self._write_pos, self._produced, self._pc
        if pos + n > self._limit:
            self._limit = self._cc[READ_POS] + cap
        k = max(0, min(n, self._limit - pos))
        if k:
            np.add(offsets, seq0, out=seq_words)
            # Whole slots, one memcpy: faster than copying each record's words alone (measured:
            # strided row copies stall on the cold ring lines; one large copy streams).
            start, size = pos % cap, self._slot_size
            off = self._slot0 + start * size
            if k == n and start + n <= cap:  # the common case: all of it, before the wrap
                self._buf[off:off + n * size] = raw
            else:
                m = min(k, cap - start)  # at most two contiguous runs: before and after the wrap
                self._buf[off:off + m * size] = raw[:m * size]
                if m < k:
                    self._buf[self._slot0:self._slot0 + (k - m) * size] = raw[m * size:k * size]
        self._write_pos = pc[WRITE_POS] = pos + k  # publish: stored after the slot contents
        if k < n:
            self._dropped = pc[DROPPED] = self._dropped + n - k
        self._produced = pc[PRODUCED] = seq0 + n
        return k

    def unlink(self) -> None:
        """Remove the name; existing mappings (ours, consumers') stay valid."""
        if _OLD_TRACKER:
            # The resource tracker keeps a *set* of names, and a consumer in this
            # process (or in a child sharing our tracker) removed ours when it
            # unregistered its attach.  Re-adding it keeps SharedMemory.unlink's
            # own unregister balanced, so the tracker prints no KeyError.
            resource_tracker.register("/" + self.name, "shared_memory")
        self._shm.unlink()

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.unlink()


class RingConsumer(RingView):
    """Consumer end: validates the header on attach, then reads records in order.

    ``read`` returns ``{kind: structured array}``: each kind's records in
    sequence order; kinds without records in the batch are absent.  The
    accounting lives in the ring, so once a quiescent producer is drained,
    ``produced == consumed + dropped + corrupt + reader_lost`` and
    ``dropped_seen == dropped``.

    The consumer holds the ring's reader lease (``lease=True``): attaching while
    another live reader holds it raises RingLeaseError naming that reader's pid.
    ``read`` raises RingWriterGone once a drained ring's writer has exited (the
    ring is then unlinked), RingLeaseError if a successor took a hung reader's
    lease over.
    """

    def __init__(self, shm: SharedMemory, header: RingHeader, dtypes: dict[int, np.dtype],
                 lease_timeout_s: float | None = DEFAULT_LEASE_TIMEOUT_S) -> None:
        super().__init__(shm, header, dtypes)
        self.dtypes = dtypes
        self._lw = shm.buf[:8 * LEASE_WORDS].cast("Q")
        self._lease = None if lease_timeout_s is None else ReaderLease(self.name, self._lw, lease_timeout_s)
        self.lost_at_attach = 0  # a dead predecessor's undelivered batch, moved to reader_lost
        if self._lease is not None:
            try:
                self._lease.acquire()
            except BaseException:
                self._lw.release()
                RingView.close(self)
                raise
            if self._lease.took_over is not None:
                self.lost_at_attach = self._reclaim_in_flight()
                prev = self._lease.took_over
                log.warning("ring %r: took over the reader lease of pid %d (%s); %d records it had taken "
                            "but not delivered are counted lost", self.name, prev.pid,
                            "hung" if _pid_alive(prev.pid) else "gone", self.lost_at_attach)
        self._r, self._nxt, self._consumed, self._corrupt, self._seen, self._pending = (
            self._cc[i] for i in (READ_POS, NEXT_SEQ, CONSUMED, CORRUPT, DROPPED_SEEN, PENDING_BAD))
        self.delivered_before = self._consumed  # by earlier readers of this ring
        self.writer_gone = False
        self._progress = (self._pc[PRODUCED], time.monotonic())  # (produced, when it last moved)
        self._next_liveness_check = 0.0

    @property
    def lease(self) -> ReaderLease | None:
        """This reader's lease (None when attached without one, to peek)."""
        return self._lease

    def _reclaim_in_flight(self) -> int:
        """A dead reader took its last batch off the ring and never delivered it: count it lost."""
        lw, cc = self._lw, self._cc
        lost = min(int(lw[IN_FLIGHT]), int(cc[CONSUMED]))
        if lost:
            lw[READER_LOST] = lw[READER_LOST] + lost
            cc[CONSUMED] = cc[CONSUMED] - lost
        lw[IN_FLIGHT] = 0
        return lost

    @classmethod
    def attach(cls, name: str, record_types: RecordRegistry | Iterable[RecordType] | None = None,
               lease: bool = True, lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S) -> RingConsumer:
        """Attach to ring ``name``.  Given ``record_types``, every kind on the ring
        must match one (name, version, itemsize); else records come back raw.
        ``lease=False`` attaches without the reader lease, to look at the counters only
        (such a consumer must not ``read``)."""
        known = None if record_types is None else as_registry(record_types)
        shm = SharedMemory(name=name, **({} if _OLD_TRACKER else {"track": False}))
        if _OLD_TRACKER:
            # Before 3.13 every attach registers the segment with this process's
            # resource tracker, which unlinks it (warning about a "leak") when we
            # exit: that would delete the producer's live ring.  The consumer
            # never owns the segment, so take the registration back.
            resource_tracker.unregister("/" + shm.name, "shared_memory")
        try:
            header = decode_header(shm.buf, shm.size)
            return cls(shm, header, resolve_dtypes(header, known, name), lease_timeout_s if lease else None)
        except BaseException:
            shm.close()
            raise

    @property
    def dropped_seen(self) -> int:
        """Events the producer dropped, as counted from sequence-number gaps."""
        return self._seen

    def read(self, max_records: int | None = None) -> dict[int, np.ndarray]:
        """Take up to ``max_records`` slots (all available if None) off the ring.
        Bad slots are counted and skipped; only impossible counters raise.
        Reading again commits the previous batch as delivered (so does ``commit``)."""
        if self._lease is None:
            raise RingLeaseError(f"ring {self.name!r} was attached without the reader lease: it cannot be read")
        self._lease.beat()
        pc, cap, r = self._pc, self._capacity, self._r
        # Load order matters: produced, write_pos, dropped -- the reverse of the
        # producer's store order, so every event numbered below `produced` is
        # either in a slot below `written` or counted in `dropped`.
        produced, written, dropped = pc[PRODUCED], pc[WRITE_POS], pc[DROPPED]
        n = written - r
        if not 0 <= n <= cap:
            raise RingFormatError(f"ring {self.name!r} counters are inconsistent: write position "
                                  f"{written}, read position {r}, capacity {cap}")
        n = n if max_records is None else min(n, max(0, max_records))
        out: dict[int, np.ndarray] = {}
        good = 0
        if n:
            idx = np.arange(r % cap, r % cap + n)
            if r % cap + n > cap:
                idx %= cap
            hdr = _take(self._slot_hdr, idx)  # a copy; the slots stay ours until read_pos moves
            ok = self._check_seqs(hdr["seq"], dropped)
            # One compare per kind present (a few u16 passes; a stable sort of the kinds costs more):
            # each kind's slots in sequence order.
            kinds = hdr["kind"]
            present = np.bincount(kinds)
            for kind, view in self._payload.items():
                if kind >= len(present) or not present[kind]:
                    continue
                pos = np.flatnonzero(kinds == kind)
                sel = hdr["length"][pos] == self._itemsize[kind]
                if ok is not None:
                    sel &= ok[pos]
                if not sel.all():
                    pos = pos[sel]
                if len(pos):  # in sequence order: the sort was stable
                    out[kind] = _take(view, idx[pos])
                    good += len(pos)
            self._consumed += good
            self._corrupt += n - good  # unknown kind, wrong length or unusable seq
            self._r = r = r + n
        if r == written and produced > self._nxt:
            # Drained: events below `produced` not seen in a slot were dropped
            # after the last written one (or sit in slots whose seq was corrupt).
            k = produced - self._nxt
            self._seen += max(0, k - self._pending)
            self._pending, self._nxt = max(0, self._pending - k), produced
        cc = self._cc
        # in_flight next to consumed: a successor moves the batch back out if we die before commit
        self._lw[IN_FLIGHT], cc[CONSUMED] = good, self._consumed
        cc[NEXT_SEQ], cc[CORRUPT] = self._nxt, self._corrupt
        cc[DROPPED_SEEN], cc[PENDING_BAD] = self._seen, self._pending
        cc[READ_POS] = r  # last: this hands the slots back to the producer
        if r == written:
            self._check_writer(produced, bool(n))
        return out

    def commit(self) -> None:
        """The last batch ``read`` returned is delivered (folded in, exported)."""
        if self._lease is not None and not self._closed:
            self._lw[IN_FLIGHT] = 0

    def _check_writer(self, produced: int, returning: bool) -> None:
        """On a drained ring whose producer has been quiet a second, ask whether it still runs
        (once a second at most); a dead writer's ring is unlinked and RingWriterGone raised
        (never by a read that returns records: those are the caller's first)."""
        now = time.monotonic()
        if returning:
            return
        if produced != self._progress[0]:
            self._progress = (produced, now)
            return
        if now - self._progress[1] < 1.0 or now < self._next_liveness_check:
            return
        self._next_liveness_check = now + 1.0
        h, lw = self.header, self._lw
        if writer_alive(h.producer_pid, int(lw[WRITER_START]), int(lw[WRITER_PIDNS])) is False:
            self.writer_gone = True
            self.commit()
            removed = remove_ring(self.name)
            raise RingWriterGone(f"ring {self.name!r}: its writer, pid {h.producer_pid}, has exited; "
                                 f"drained{' and removed' if removed else ' (could not remove it)'}")

    def stats(self) -> dict[str, int]:
        """The ring's counters (RingView.stats) plus the reader's: reader_lost (events dead
        readers took but never delivered), delivered_before (by earlier readers) and
        reader_pid (the lease holder the header names, 0: none)."""
        st = super().stats()
        lw = self._lw
        st.update(reader_lost=int(lw[READER_LOST]), in_flight=int(lw[IN_FLIGHT]),
                  delivered_before=int(self.delivered_before), reader_pid=int(lw[LEASE_PID]) & 0xFFFFFFFF)
        return st

    def close(self) -> None:
        """Commit, give the lease back and unmap."""
        if not getattr(self, "_closed", True) and hasattr(self, "_lw"):
            if getattr(self, "_lease", None) is not None:
                self.commit()
                self._lease.release()
            self._lw.release()
        super().close()

    def _check_seqs(self, seqs: np.ndarray, dropped: int) -> np.ndarray | None:
        """Count sequence gaps as drops; return a mask of slots with a usable
        seq, or None if all are usable.  A seq going backwards, or jumping
        further than the producer's drop count allows, marks its slot corrupt."""
        n, nxt, seen, last = len(seqs), self._nxt, self._seen, int(seqs[-1])
        if (self._pending == 0 and int(seqs[0]) >= nxt and last + 1 - nxt - n <= dropped - seen
                and (n == 1 or bool(np.all(seqs[1:] > seqs[:-1])))):
            self._seen, self._nxt = seen + last + 1 - nxt - n, last + 1  # common case: one vector test
            return None
        ok = np.ones(n, dtype=bool)
        pending = self._pending  # slots since the last usable seq whose own seq was not usable
        for i, s in enumerate(seqs.tolist()):
            gap = s - nxt
            if gap < 0 or gap - pending > dropped - seen:
                ok[i] = False
                pending += 1
            else:
                seen, pending, nxt = seen + max(0, gap - pending), 0, s + 1
        self._nxt, self._seen, self._pending = nxt, seen, pending
        return ok


def _take(view: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """view[rows] as a copy: rows taken as opaque bytes (one memcpy each) rather than field by field
    (numpy copies a structured item per field), then seen as the record dtype again."""
    raw = view.view(np.dtype((np.void, view.dtype.itemsize)))  # a view of the view: no new buffer export
    return raw[rows].view(view.dtype)


def _pid_alive(pid: int) -> bool:
    return process_start_ticks(pid) is not None


class RingWriterGone(RingFormatError):
    """The ring's writer has exited and the ring is drained: detach (it was unlinked if it could be)."""


class ProbeRing:
    """Entry points: ``ProbeRing.create`` (producer) and ``ProbeRing.attach`` (consumer)."""

    create = staticmethod(RingProducer.create)
    attach = staticmethod(RingConsumer.attach)


def bench_ingest(n_records: int, capacity: int) -> dict[str, float]:
    """Push ``n_records`` through producer -> consumer in this process.

    Three quarters go in bursts of capacity/2, each drained at once (no drops);
    the rest in bursts of 2*capacity (overflow, given n_records/4 > capacity).
    Payloads are pre-encoded bytes: this times the ring, not record encoding.
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
    return {"events_per_second": n_records / elapsed, "produced": st["produced"],
            "consumed": st["consumed"], "dropped": st["dropped"]}
