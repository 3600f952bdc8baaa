"""Consumer end of the probe ring (the layout and the accounting are in ring.py's docstring).

One reader per ring, holding its lease (ring_lease.py); it validates the header on attach, reads
records in sequence order, counts drops from sequence gaps and corrupt slots, and notices when a
drained ring's writer has gone: by its pid in this pid namespace, by its heartbeat from another
(ring_heartbeat.py).
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

from infersight.probes.ring_discovery import remove_ring
from infersight.probes.ring_heartbeat import DEFAULT_MISSED_BEATS, WriterBeat, writer_beat
from infersight.probes.ring_lease import (
    DEFAULT_LEASE_TIMEOUT_S, IN_FLIGHT, LEASE_PID, LEASE_WORDS, READER_LOST, WRITER_PIDNS, WRITER_START,
    ReaderLease, RingLeaseError, process_start_ticks, writer_alive,
)
from infersight.probes.schema import (
    CONSUMED, CORRUPT, DROPPED, DROPPED_SEEN, NEXT_SEQ, PENDING_BAD, PRODUCED, READ_POS, WRITE_POS, Expand,
    RecordRegistry, RecordType, RingFormatError, RingHeader, RingView, as_registry, decode_header, resolve_dtypes,
)

log = logging.getLogger("infersight.probes")
#: Before Python 3.13 an attach registers the segment with the resource tracker (see RingConsumer.attach).
OLD_TRACKER = os.name == "posix" and sys.version_info < (3, 13)


class RingConsumer(RingView):
    """Consumer end: validates the header on attach, then reads records in order.

    ``read`` returns ``{kind: structured array}``: each kind's records in
    sequence order; kinds without records in the batch are absent.  Attached
    with a registry that has an ``expand`` (the probes' one), what it returns
    is the expanded records (batched kinds read as per-record ones).  The
    accounting, in slots, lives in the ring, so once a quiescent producer is drained,
    ``produced == consumed + dropped + corrupt + reader_lost`` and
    ``dropped_seen == dropped``.

    The consumer holds the ring's reader lease (``lease=True``): attaching while
    another live reader holds it raises RingLeaseError naming that reader's pid.
    ``read`` raises RingWriterGone once a drained ring's writer has exited (the
    ring is then unlinked), RingLeaseError if a successor took a hung reader's
    lease over. ``missed_beats``: a writer in another pid namespace is taken to
    have exited when its heartbeat is that many intervals old.
    """

    def __init__(self, shm: SharedMemory, header: RingHeader, dtypes: dict[int, np.dtype],
                 lease_timeout_s: float | None = DEFAULT_LEASE_TIMEOUT_S, expand: Expand | None = None,
                 missed_beats: int = DEFAULT_MISSED_BEATS) -> None:
        super().__init__(shm, header, dtypes)
        self.missed_beats = missed_beats
        # The segment itself: a successor writer may take the name, and must not lose its ring to us.
        fd = getattr(shm, "_fd", -1)
        self.inode = os.fstat(fd).st_ino if fd >= 0 else None
        self.dtypes = dtypes
        self._expand = expand  # the registry's: batched kinds read as the per-record ones
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
        #: Records `read` has returned, each batched slot counted once per entry it expands to (the ring's
        #: own counters count slots: a TOKENS_BATCH or MEMBERS_BATCH slot is one event there, many records here).
        self.records_read = 0
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
               lease: bool = True, lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S,
               missed_beats: int = DEFAULT_MISSED_BEATS) -> RingConsumer:
        """Attach to ring ``name``.  Given ``record_types``, every kind on the ring
        must match one (name, version, itemsize); else records come back raw.
        ``lease=False`` attaches without the reader lease, to look at the counters only
        (such a consumer must not ``read``)."""
        known = None if record_types is None else as_registry(record_types)
        shm = SharedMemory(name=name, **({} if OLD_TRACKER else {"track": False}))
        if OLD_TRACKER:
            # Before 3.13 every attach registers the segment with this process's
            # resource tracker, which unlinks it (warning about a "leak") when we
            # exit: that would delete the producer's live ring.  The consumer
            # never owns the segment, so take the registration back.
            resource_tracker.unregister("/" + shm.name, "shared_memory")
        try:
            header = decode_header(shm.buf, shm.size)
            return cls(shm, header, resolve_dtypes(header, known, name), lease_timeout_s if lease else None,
                       None if known is None else known.expand, missed_beats)
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
            # The slots stay ours until read_pos moves: read in place. One run of slots (the usual
            # case) is read through views of it; a run that wraps is gathered, in order, first.
            start = r % cap
            rows = None if start + n <= cap else np.arange(start, start + n) % cap
            hdr = self._slot_hdr[start:start + n] if rows is None else _take(self._slot_hdr, rows)
            ok = self._check_seqs(hdr["seq"], dropped)
            # One compare per kind present (a few u16 passes over one contiguous copy of the kinds;
            # a stable sort of the kinds costs more): each kind's slots in sequence order.
            kinds = np.ascontiguousarray(hdr["kind"])
            present = np.bincount(kinds)
            positions: dict[int, np.ndarray] = {}
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
                    out[kind] = _take(view[start:start + n], pos) if rows is None else _take(view, rows[pos])
                    positions[kind] = pos
                    good += len(pos)
            if self._expand is not None and out:
                out, refused = self._expand(out, positions)
                good -= refused
            self.records_read += sum(len(rec) for rec in out.values())
            self._consumed += good
            self._corrupt += n - good  # unknown kind, wrong length, unusable seq or refused by expand
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
        (once a second at most): by pid where this process can judge it, else by its heartbeat.
        A gone writer's ring is unlinked (if the name is still this segment) and RingWriterGone
        raised (never by a read that returns records: those are the caller's first)."""
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
        by_pid = writer_alive(h.producer_pid, int(lw[WRITER_START]), int(lw[WRITER_PIDNS]))
        beat = writer_beat(lw, self.missed_beats)
        if by_pid is False:
            why, dead = f"its writer, pid {h.producer_pid}, has exited", beat is not WriterBeat.CLOSED
        elif beat is WriterBeat.CLOSED:
            why, dead = "its writer closed it", False
        elif by_pid is None and beat is WriterBeat.DEAD:
            why, dead = (f"its writer (pid {h.producer_pid} in another pid namespace) stopped beating over "
                         f"{self.missed_beats} heartbeats ago"), True
        else:
            return
        self.writer_gone = True
        self.commit()
        removed = remove_ring(self.name, self.inode)
        raise RingWriterGone(f"ring {self.name!r}: {why}; drained"
                             f"{' and removed' if removed else ' (not removed: gone, or the name is a new ring)'}",
                             dead=dead)

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
    """The ring's writer has exited and the ring is drained: detach (it was unlinked if it could be).
    ``dead``: it exited without closing the ring (crashed, killed), not a clean close."""

    def __init__(self, message: str, dead: bool = False) -> None:
        super().__init__(message)
        self.dead = dead
