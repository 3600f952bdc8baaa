"""Which probe rings exist in /dev/shm, and which of them a dead writer left behind.

A ring records who wrote it (pid, process start time, pid namespace: ring_lease.py); a ring
whose writer is gone from this pid namespace, or whose pid now belongs to another process, is
stale. Discovery leaves stale rings out; a reader that drained one removes it (remove_ring).
A writer in another pid namespace cannot be judged by pid, so its ring is never called stale.
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


def stale_ring(name: str) -> bool:
    """True when ``name`` is a ring whose writer is known to have exited: its pid is gone (or is
    another process now) in this pid namespace. False for live rings, for rings whose writer this
    process cannot judge (another pid namespace), and for segments that are not rings."""
    head = read_ring_head(name)
    if head is None:
        return False
    magic, version, pid = _HEAD.unpack_from(head, 0)
    if magic != MAGIC or version != LAYOUT_VERSION:
        return False
    start, pidns = ring_writer(head)
    return writer_alive(pid, start, pidns) is False


def remove_ring(name: str) -> bool:
    """Unlink a dead writer's ring and its capture control block; False if it could not be."""
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
    offered once its holder has gone."""

    def __init__(self, prefix: str = "infersight-", recheck_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:  # noqa: D107
        self.prefix, self.recheck_s, self.clock = prefix, recheck_s, clock
        self.skipped = 0
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
