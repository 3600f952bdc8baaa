"""Which probe rings exist in /dev/shm, and which of them a dead writer left behind.

A ring records who wrote it (pid, process start time, pid namespace: ring_lease.py); a ring
whose writer is gone from this pid namespace, or whose pid now belongs to another process, is
stale. Discovery leaves stale rings out; a reader that drained one removes it (remove_ring).
A writer in another pid namespace cannot be judged by pid: its heartbeat judges it
(ring_heartbeat.py); its ring is stale once the beats have stopped for `missed` intervals.
A discovering agent (RingDiscovery) also leaves out rings another live agent reads: it says so
once per ring, then only counts, and attaches when the ring is free.
"""
from __future__ import annotations

import logging
import os
import struct
import time
from typing import Callable, Container

from infersight.probes.control import control_name
from infersight.probes.ring_heartbeat import DEFAULT_MISSED_BEATS, WriterBeat, writer_beat
from infersight.probes.ring_lease import SHM_DIR, lease_refusal, read_ring_head, ring_writer, writer_alive
from infersight.probes.schema import LAYOUT_VERSION, MAGIC

log = logging.getLogger("infersight.probes")

_HEAD = struct.Struct("<8sI16xI")  # magic, layout version, producer pid (offset 28)


def list_rings(prefix: str = "infersight-", live_only: bool = True) -> list[str]:
    """Names of shared memory segments starting with ``prefix`` (Linux /dev/shm; [] elsewhere).
    ``live_only``: leave out rings whose writer is known to have exited (stale_ring)."""
    try:
        with os.scandir(SHM_DIR) as entries:
            names = sorted(e.name for e in entries if e.name.startswith(prefix) and e.is_file())
    except OSError:
        return []
    return [n for n in names if not stale_ring(n)] if live_only else names


def stale_ring(name: str, missed: int = DEFAULT_MISSED_BEATS) -> bool:
    """True when ``name`` is a ring whose writer is known to have exited: its pid is gone (or is
    another process now) in this pid namespace, or, in another, it stopped beating ``missed``
    intervals ago. False for live rings, rings closed cleanly (a reader may still drain them),
    writers that do not beat and segments that are not rings."""
    return writer_state(name, missed) is WriterBeat.DEAD


def pid_verdict(head: bytes) -> bool | None:
    """Is the writer of the ring whose first bytes are ``head`` alive, judged by its pid? None:
    not judged so (another pid namespace, not a ring of this layout)."""
    magic, version, pid = _HEAD.unpack_from(head, 0)
    if magic != MAGIC or version != LAYOUT_VERSION:
        return None
    start, pidns = ring_writer(head)
    return writer_alive(pid, start, pidns)


def writer_state(name: str, missed: int = DEFAULT_MISSED_BEATS) -> WriterBeat | None:
    """What is known of ring ``name``'s writer: by pid where this process can judge it (DEAD, or
    ALIVE unless it CLOSED the ring), else by its heartbeat. None: no such ring of this layout."""
    head = read_ring_head(name)
    if head is None:
        return None
    magic, version = _HEAD.unpack_from(head, 0)[:2]
    if magic != MAGIC or version != LAYOUT_VERSION:
        return None
    by_pid, beat = pid_verdict(head), writer_beat(memoryview(head).cast("Q"), missed)
    if by_pid is False:
        return WriterBeat.DEAD
    if by_pid is True and beat is not WriterBeat.CLOSED:
        return WriterBeat.ALIVE  # a live process that is slow to beat (GIL held) is alive
    return beat


def remove_ring(name: str, inode: int | None = None) -> bool:
    """Unlink a dead writer's ring and its capture control block; False if it could not be.
    ``inode``: only if the name is still that segment (a successor may have taken the name)."""
    if inode is not None:
        try:
            if os.stat(os.path.join(SHM_DIR, name)).st_ino != inode:
                return False  # the name is another writer's ring now: not ours to remove
        except OSError:
            return True  # already gone
    removed = True
    for path in (name, control_name(name)):
        try:
            os.unlink(os.path.join(SHM_DIR, path))
        except FileNotFoundError:
            pass
        except OSError:
            removed = False  # someone else's (sticky /dev/shm): leave it
    return removed


class RingDiscovery:
    """The discovered rings an agent may attach now: live rings (not stale), not capture control
    blocks, and not rings whose reader lease another live agent holds (a ring has one reader).

    A held ring is logged once, when it is first found held (again after it was free), then only
    counted: `skipped` (times it was found held, at most once per recheck_s) and `held` (rings held
    elsewhere now; exporters.discovery renders both). It is checked again every recheck_s and
    offered once its holder has gone. `dead` counts the rings, discovered or named, whose writer
    died while this agent read them (the agent's RingSet counts them here, rendered beside)."""

    def __init__(self, prefix: str = "infersight-", recheck_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:  # noqa: D107
        self.prefix, self.recheck_s, self.clock = prefix, recheck_s, clock
        self.skipped = 0
        self.dead = 0
        self._held: dict[str, float] = {}  # ring held elsewhere -> when to check it again

    @property
    def held(self) -> int:
        """Rings another agent reads, as last checked."""
        return len(self._held)

    def candidates(self, skip: Container[str] = ()) -> list[str]:
        """Ring names to try to attach (those in `skip`, e.g. already attached, are not checked)."""
        control = control_name("")
        names = [n for n in list_rings(self.prefix) if not n.endswith(control)]
        self._held = {n: t for n, t in self._held.items() if n in names}  # gone rings are forgotten
        now, out = self.clock(), []
        for name in names:
            if name in skip:
                continue
            if name in self._held and now < self._held[name]:
                continue
            refusal = lease_refusal(name)
            if refusal is None:
                if self._held.pop(name, None) is not None:
                    log.info("ring %r is no longer read by another agent; attaching", name)
                out.append(name)
                continue
            if name not in self._held:
                log.warning("%s; not attaching it while that agent reads it (checked every %.0f s, counted "
                            "in infersight_probe_ring_attach_skipped_total)", refusal, self.recheck_s)
            self.skipped += 1
            self._held[name] = now + self.recheck_s
        return out
