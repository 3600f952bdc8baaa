"""CPU time (and resident memory) of processes and their threads, read from /proc (Linux): where a
serving benchmark's CPU goes (the engine's threads, the agent, the clients), so a client-side loss can
be put on a part.

Times are the kernel's utime + stime in clock ticks, converted to seconds; a process that has gone or
a system without /proc reads as NaN, never an error (the benchmark's figures do not depend on them).
"""
from __future__ import annotations

import os
from pathlib import Path

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _stat_cpu_s(stat: bytes) -> float:
    # The comm field sits in parentheses and may hold spaces: split after its closing one.
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14, 15 of proc(5))


def process_cpu_s(pid: int) -> float:
    """utime + stime of a whole process (all its threads), seconds; NaN when unreadable."""
    try:
        return _stat_cpu_s(Path(f"/proc/{pid}/stat").read_bytes())
    except (OSError, ValueError, IndexError):
        return float("nan")


def process_memory_mb(pid: int | None) -> dict[str, float]:
    """A process's resident set, MB: rss (VmRSS), anon (RssAnon: its own heap) and shmem (RssShmem:
    shared pages it touched, e.g. a probe ring, bounded by the ring's size); NaN when unreadable."""
    out = {"rss": float("nan"), "anon": float("nan"), "shmem": float("nan")}
    if pid is None:
        return out
    keys = {"VmRSS:": "rss", "RssAnon:": "anon", "RssShmem:": "shmem"}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = keys.get(line.split(maxsplit=1)[0] if line else "")
            if key:
                out[key] = int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def spawned_children(pid: int) -> list[int]:
    """The children of a process that multiprocessing spawned (its command line runs spawn_main): serve's
    engine process. Empty when none or unreadable."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            kids = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for kid in kids:
            try:
                if b"spawn_main" in Path(f"/proc/{kid}/cmdline").read_bytes():
                    out.append(int(kid))
            except (OSError, ValueError):
                continue
    return sorted(out)


def thread_cpu_s(pid: int) -> dict[str, float]:
    """utime + stime per thread of one process, seconds, keyed "name/tid" (Python threads all read
    "python" before 3.14: the tid tells them apart, the busiest ones are the event loop and the engine)."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            out[f"{name}/{tid}"] = _stat_cpu_s(Path(f"/proc/{pid}/task/{tid}/stat").read_bytes())
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the listing and the read
    return out


def cores_used(before: dict[str, float], after: dict[str, float], wall_s: float, top: int = 0) -> dict[str, float]:
    """CPU cores used per key over wall_s seconds (keys present in both readings), busiest first;
    top > 0 keeps that many."""
    used = sorted(((k, (after[k] - before[k]) / wall_s) for k in after if k in before and wall_s > 0),
                  key=lambda kv: -kv[1])
    return {k: round(v, 3) for k, v in (used[:top] if top else used)}
