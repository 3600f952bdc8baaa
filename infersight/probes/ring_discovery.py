"""Which probe rings exist in /dev/shm, and which of them a dead writer left behind.

A ring records who wrote it (pid, process start time, pid namespace: ring_lease.py); a ring
whose writer is gone from this pid namespace, or whose pid now belongs to another process, is
stale. Discovery leaves stale rings out; a reader that drained one removes it (remove_ring).
A writer in another pid namespace cannot be judged by pid, so its ring is never called stale.
"""
from __future__ import annotations

import os
import struct

from infersight.probes.control import control_name
from infersight.probes.ring_lease import SHM_DIR, read_ring_head, ring_writer, writer_alive
from infersight.probes.schema import LAYOUT_VERSION, MAGIC

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
