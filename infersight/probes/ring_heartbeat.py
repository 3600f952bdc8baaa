"""The ring writer's heartbeat: how a reader in another pid namespace tells a dead writer's ring.

A reader in the writer's pid namespace judges the writer by pid and start time (ring_lease.py).
In a pod the agent and the engine are two containers with two pid namespaces sharing only
/dev/shm: the writer's pid means nothing to the reader (it may even be the reader's own pid
number), so the writer beats instead. A daemon thread of the writing process stores
CLOCK_MONOTONIC into the ring header every ``interval`` seconds, idle or not; CLOCK_MONOTONIC is
one clock for every process of the machine (pid namespaces do not change it; a time namespace
would, and pods do not use one). A reader declares the ring dead once the beat is ``missed``
intervals old; a writer that closes its ring stores CLOSED, so a clean exit is told at once.

Header words used here (u64 index into the first 192 bytes; see ring.py's drawing), on the
producer's line, written by the writing process only::

    13 WRITER_BEAT           CLOCK_MONOTONIC ns of the last beat; CLOSED: closed cleanly; 0: never
    14 WRITER_BEAT_INTERVAL  ns between beats (0: this writer does not beat)

A thread, not the write path: an idle engine writes nothing, and the write path stays as it was.
A writer whose interpreter holds the GIL for longer than ``missed`` intervals (a long C call that
does not release it) looks dead for that long; the reader then stops reading a live ring. The
default, 5 beats of 1 s, is far above CPython's 5 ms switch interval.
"""
from __future__ import annotations

import os
import threading
import time
from enum import Enum

WRITER_BEAT, WRITER_BEAT_INTERVAL = 13, 14
CLOSED = (1 << 64) - 1
DEFAULT_BEAT_INTERVAL_S = 1.0
#: Beats a reader lets pass before it declares the writer dead.
DEFAULT_MISSED_BEATS = 5


class WriterBeat(Enum):
    """What a ring's heartbeat says about its writer."""

    ALIVE = "alive"  # beat within the allowed intervals
    DEAD = "dead"  # no beat for `missed` intervals: the writer crashed or was killed
    CLOSED = "closed"  # the writer closed the ring
    UNKNOWN = "unknown"  # the writer does not beat


def writer_beat(words: memoryview, missed: int = DEFAULT_MISSED_BEATS, now_ns: int | None = None) -> WriterBeat:
    """Judge a ring's writer from its header words (a u64 view of at least 15 words)."""
    beat, interval = int(words[WRITER_BEAT]), int(words[WRITER_BEAT_INTERVAL])
    if beat == CLOSED:
        return WriterBeat.CLOSED
    if interval == 0 or beat == 0:
        return WriterBeat.UNKNOWN
    now = time.monotonic_ns() if now_ns is None else now_ns
    return WriterBeat.DEAD if now - beat > missed * interval else WriterBeat.ALIVE


def beat_age_s(words: memoryview) -> float | None:
    """Seconds since the writer's last beat (None: it does not beat, or closed the ring)."""
    beat = int(words[WRITER_BEAT])
    if beat in (0, CLOSED) or int(words[WRITER_BEAT_INTERVAL]) == 0:
        return None
    return (time.monotonic_ns() - beat) / 1e9


class WriterHeartbeat:
    """Beats into one ring's header from a daemon thread until ``stop``."""

    def __init__(self, words: memoryview, interval_s: float = DEFAULT_BEAT_INTERVAL_S) -> None:
        if not interval_s > 0:
            raise ValueError(f"heartbeat interval must be > 0 s, got {interval_s}")
        self._w, self.interval_s = words, interval_s
        self._stop, self._pid = threading.Event(), os.getpid()
        words[WRITER_BEAT_INTERVAL] = int(interval_s * 1e9)
        words[WRITER_BEAT] = time.monotonic_ns()  # the first beat before anyone can attach
        self._thread = threading.Thread(target=self._run, name="infersight-ring-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._w[WRITER_BEAT] = time.monotonic_ns()

    def stop(self) -> None:
        """Stop beating and mark the ring closed (the writer is done with it). In a forked child
        (no beating thread there) it marks nothing: the parent still writes the ring."""
        if self._stop.is_set():
            return  # stopped already (close, then the garbage collector)
        self._stop.set()
        if os.getpid() != self._pid:
            return
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._w[WRITER_BEAT] = CLOSED
