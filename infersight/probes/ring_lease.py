"""One reader per ring: the reader lease, and whether the ring's writer is still alive.

The lease has two parts. The kernel part is an exclusive ``flock`` on the ring's file in
/dev/shm: the kernel drops it when the reader exits, SIGKILL included, so a dead reader's
successor takes over at once, and it holds across pid namespaces that share /dev/shm. The
header part (reader pid, heartbeat) names the holder in the refusal message and covers a
reader that is alive but hung: one whose heartbeat is older than the lease timeout is taken
over, and it notices the next time it reads (the lease names another pid) and stops.

Header words used here (u64 index into the first 192 bytes; see ring.py's drawing)::

     6 LEASE_PID     lease generation << 32 | reader pid (pid 0: no reader); static line, written
                   on attach and close (the generation tells two readers of one process apart)
     7 READER_LOST   events dead readers took but never delivered (added by their successor)
    11 WRITER_START  writer's process start time (clock ticks since boot, /proc/PID/stat)
    12 WRITER_PIDNS  inode of the writer's pid namespace (0: unknown)
    13, 14         the writer's heartbeat (ring_heartbeat.py), for readers in another pid namespace
    15 READER_PIDNS  inode of the lease holder's pid namespace (0: unknown); written on attach
    22 IN_FLIGHT     records of the last read batch not yet committed as delivered
    23 LEASE_BEAT    reader heartbeat, CLOCK_MONOTONIC ns (system-wide on Linux)

The writer writes its two words once, at create: its write path is untouched.

Across pid namespaces (a pod's restarted sidecar) a holder's pid means nothing here: a free lock
then decides. A reader that took a hung one's lease over holds no lock at first; it takes the
lock as soon as the hung one lets go (checked once a second), so a free lock means no live reader.
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from dataclasses import dataclass

from infersight.probes.schema import RingFormatError

LEASE_PID, READER_LOST, WRITER_START, WRITER_PIDNS, IN_FLIGHT, LEASE_BEAT = 6, 7, 11, 12, 22, 23
READER_PIDNS = 15
LEASE_WORDS = 24  # the view covers bytes [0, 192)
_PID_MASK = 0xFFFFFFFF
#: A reader whose heartbeat is older than this is taken to be hung, and its lease is taken over.
DEFAULT_LEASE_TIMEOUT_S = 30.0
SHM_DIR = "/dev/shm"


class RingLeaseError(RingFormatError):
    """A ring's reader lease cannot be had (another reader holds it) or was lost."""


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a ring's lease: pid, how long ago it last read (seconds; None: never), and its pid
    namespace (0: unknown)."""

    pid: int
    heartbeat_age_s: float | None
    pidns: int = 0

    @property
    def judged_by_pid(self) -> bool:
        """Can this process ask whether the holder's pid runs? Not from another pid namespace."""
        return self.pidns in (0, pid_namespace())


def process_start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot, None if there is no such
    process (a start time tells a reused pid from the process that had it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: fields after the last ")" are plain.
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def pid_namespace() -> int:
    """Inode of this process's pid namespace (0 where /proc does not say)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def writer_identity() -> tuple[int, int]:
    """(start ticks, pid namespace) of this process, for a ring it creates."""
    return process_start_ticks(os.getpid()) or 0, pid_namespace()


_WRITER_ID = struct.Struct("<QQ")  # WRITER_START, WRITER_PIDNS


def stamp_writer(buf: memoryview) -> None:
    """Record this process in a new ring as its writer (once, at create)."""
    _WRITER_ID.pack_into(buf, 8 * WRITER_START, *writer_identity())


def ring_writer(head: bytes) -> tuple[int, int]:
    """(start ticks, pid namespace) of the writer, from a ring's first 8 * LEASE_WORDS bytes."""
    return _WRITER_ID.unpack_from(head, 8 * WRITER_START)


def writer_alive(pid: int, start_ticks: int, pidns: int) -> bool | None:
    """Is the ring's writer still running? None when this process cannot tell (the writer is in
    another pid namespace, or the ring did not record who wrote it)."""
    if pid <= 0 or start_ticks == 0 or pidns == 0 or pidns != pid_namespace():
        return None
    return process_start_ticks(pid) == start_ticks


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


class ReaderLease:
    """The reader side of a ring's lease. ``words``: a u64 memoryview of the ring's first 192
    bytes. ``acquire`` raises RingLeaseError naming the holder when another live reader has it."""

    def __init__(self, name: str, words: memoryview, timeout_s: float = DEFAULT_LEASE_TIMEOUT_S) -> None:
        self.name, self._w, self.timeout_s, self.pid = name, words, timeout_s, os.getpid()
        self._fd: int | None = None
        self._held = False
        self._word = 0  # our generation << 32 | pid, once acquired
        self.took_over: LeaseHolder | None = None  # the predecessor whose lease this one took
        self._next_lock_try = 0.0  # without the lock (a hung predecessor's): when to try for it again

    def holder(self) -> LeaseHolder | None:
        """The reader the header names (None: none)."""
        return _holder(self._w)

    def acquire(self) -> None:
        self._fd, locked = _try_lock(self.name)
        prev = self.holder()
        refusal = _refusal(self.name, locked, prev, self.timeout_s, self.pid)
        if refusal is not None:
            self.release()
            raise RingLeaseError(refusal)
        self.took_over = prev  # a dead (lock free) or hung (heartbeat too old) predecessor, or None
        self._w[LEASE_BEAT] = time.monotonic_ns()
        self._word = ((int(self._w[LEASE_PID]) >> 32) + 1 & _PID_MASK) << 32 | self.pid
        self._w[READER_PIDNS] = pid_namespace()  # before the pid word: a reader of both sees ours
        self._w[LEASE_PID] = self._word
        self._held = True

    def beat(self) -> None:
        """Refresh the heartbeat; RingLeaseError if another reader has taken the lease over."""
        if self._w[LEASE_PID] != self._word:
            raise RingLeaseError(f"ring {self.name!r}: reader pid {int(self._w[LEASE_PID]) & _PID_MASK} took over this "
                                 f"reader's lease (its heartbeat was over {self.timeout_s:.0f} s old); "
                                 "stopped reading")
        self._w[LEASE_BEAT] = time.monotonic_ns()
        if self._fd is None and time.monotonic() >= self._next_lock_try:
            # A hung predecessor's lease, taken without its lock: take the lock once it lets go, so that
            # a free lock means no live reader (what a reader in another pid namespace goes by).
            self._next_lock_try = time.monotonic() + 1.0
            fd, locked = _try_lock(self.name)
            if locked:
                self._fd = fd

    def release(self) -> None:
        """Give the lease back (a clean exit): the next reader attaches without a takeover."""
        try:
            if self._held and self._w[LEASE_PID] == self._word:
                self._w[LEASE_PID] = self._word & ~_PID_MASK  # keep the generation, name no reader
            self._held = False
        finally:
            if self._fd is not None:
                os.close(self._fd)  # drops the flock
                self._fd = None



def _try_lock(name: str) -> tuple[int | None, bool | None]:
    """(fd holding the ring file's flock, True), (None, False) when a live process holds it, or
    (None, None) where there is no flock to take (no /dev/shm file)."""
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        return None, (False if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None)
    return fd, True


def _refusal(name: str, locked: bool | None, prev: LeaseHolder | None, timeout_s: float, me: int) -> str | None:
    """Why a reader may not take the lease (None: it may)."""
    fresh = prev is not None and prev.heartbeat_age_s is not None and prev.heartbeat_age_s <= timeout_s
    if locked is False:  # the kernel says a live process holds it: refused unless it is hung
        return _held_message(name, prev) if prev is None or fresh else None
    if locked and prev is not None and not prev.judged_by_pid:
        return None  # the lock is free and the holder's pid is another namespace's: it has gone
    if prev is not None and fresh and prev.pid != me and _pid_running(prev.pid):
        # No flock here, or the lock is free because the reader took a hung one's lease over
        # (it holds no lock): the header decides, and it names a live reader.
        return _held_message(name, prev)
    return None


def read_ring_head(name: str) -> bytes | None:
    """The first 8 * LEASE_WORDS bytes of shared memory segment ``name`` (None: missing or shorter)."""
    try:
        with open(os.path.join(SHM_DIR, name), "rb") as f:
            head = f.read(8 * LEASE_WORDS)
    except OSError:
        return None
    return head if len(head) == 8 * LEASE_WORDS else None


def lease_refusal(name: str, timeout_s: float = DEFAULT_LEASE_TIMEOUT_S) -> str | None:
    """Would this process be refused ring ``name``'s lease? The message if so, else None (also
    when the ring is missing or unreadable: attaching will say why). Changes nothing."""
    head = read_ring_head(name)
    if head is None:
        return None
    prev = _holder(memoryview(head).cast("Q"))
    fd, locked = _try_lock(name)
    if fd is not None:
        os.close(fd)
    return _refusal(name, locked, prev, timeout_s, os.getpid())


def _holder(words: memoryview) -> LeaseHolder | None:
    """The reader a ring's header words name as the lease holder (None: none)."""
    pid, beat = int(words[LEASE_PID]) & _PID_MASK, int(words[LEASE_BEAT])
    if pid == 0:
        return None
    return LeaseHolder(pid, (time.monotonic_ns() - beat) / 1e9 if beat else None, int(words[READER_PIDNS]))


def _held_message(name: str, holder: LeaseHolder | None) -> str:
    if holder is None:
        return f"ring {name!r} is already being read by another agent (pid unknown); a ring has one reader"
    age = "never read" if holder.heartbeat_age_s is None else f"last read {holder.heartbeat_age_s:.1f} s ago"
    return (f"ring {name!r} is already read by agent pid {holder.pid} ({age}); a ring has one reader: "
            "stop that agent first")
