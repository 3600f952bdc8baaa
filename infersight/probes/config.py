"""The probes' one config object, and the bounded task-label table."""
from __future__ import annotations

import os
import time
from typing import Callable
from dataclasses import dataclass, field

from infersight.probes.records import valid_engine_name


def default_capture_dir() -> str:
    """``${XDG_STATE_HOME:-~/.local/state}/infersight/captures``: this user's, not a shared /tmp
    directory anyone can list (the engine creates it 0700 and writes captures 0600)."""
    state = os.environ.get("XDG_STATE_HOME", "")
    base = state if os.path.isabs(state) else os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "infersight", "captures")


@dataclass
class ProbeConfig:
    """events: semantic records into a shared-memory ring. nvtx: NVTX ranges (plus record_function
    during torch.profiler captures). task_labels: the allowed labels (None: the first
    max_task_labels seen); anything else is recorded as "other". capture_dir: where on-demand
    captures (asked for through the control block) are written. gpu_uuids: the GPUs the engine uses,
    reported to the sidecar in GPU records (None: the GPUs this process can see, probes.gpu_uuids).
    engine_name: the engine's name, announced in an ENGINE record (the `engine` label of an agent that
    reads several rings; at most 32 printable ASCII characters; None: the ring's name).
    host_pause_min_s: the process's garbage collections at least this long go out as HOST_PAUSE
    records (probes.host_pauses; None: not timed). 5 ms: the young generations' collections (~0.1 ms
    each, hundreds a second) stay out, a full one over an engine's heap (0.1 s and more) is in."""

    events: bool = True
    nvtx: bool = True
    record_function: bool = True
    expert_counts: bool = True
    ring_name: str | None = None
    ring_capacity: int = 1 << 16
    task_labels: tuple[str, ...] | None = None
    max_task_labels: int = 32
    capture_dir: str = field(default_factory=default_capture_dir)
    gpu_uuids: tuple[str, ...] | None = None
    engine_name: str | None = None
    host_pause_min_s: float | None = 0.005

    def __post_init__(self) -> None:
        if self.ring_capacity < 2:
            raise ValueError(f"ring_capacity must be >= 2, got {self.ring_capacity}")
        if self.max_task_labels < 1:
            raise ValueError(f"max_task_labels must be >= 1, got {self.max_task_labels}")
        if self.host_pause_min_s is not None and not self.host_pause_min_s >= 0:
            raise ValueError(f"host_pause_min_s must be >= 0 or None, got {self.host_pause_min_s}")
        if self.ring_name is None:
            self.ring_name = f"infersight-{os.getpid()}"
        if self.engine_name is not None and not valid_engine_name(self.engine_name):
            raise ValueError(f"an engine name is 1 to 32 printable ASCII characters without spaces, "
                             f"got {self.engine_name!r}")


#: A label in use is announced again at most this often: an agent that attaches to a ring after the
#: first announcement (restarted, or a second reader after the first drained it) learns a label before
#: the first request that uses it once this much time has passed since the last announcement.
ANNOUNCE_EVERY_S = 5.0


class TaskLabels:
    """Interns task labels to small ids. Id 0 is "other" (unknown or over the bound); ids are
    stable for the life of the producer."""

    OTHER = "other"

    def __init__(self, allowed: tuple[str, ...] | None, max_labels: int,
                 clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.allowed = frozenset(allowed) if allowed is not None else None
        self.max_labels = max_labels
        self.ids: dict[str, int] = {self.OTHER: 0}
        self._clock_ns = clock_ns
        self._announced_ns: dict[str, int] = {}

    def intern(self, label: str | None) -> tuple[int, bool]:
        """(id, announce): announce is True for a new label and again for a label last announced
        ANNOUNCE_EVERY_S or more ago (the caller writes a TASK_LABEL record). None and labels outside
        the bound map to "other", never announced."""
        if label is None:
            return 0, False
        tid = self.ids.get(label)
        if tid is None:
            if (self.allowed is not None and label not in self.allowed) or len(self.ids) > self.max_labels:
                return 0, False
            tid = self.ids[label] = len(self.ids)
        now = self._clock_ns()
        last = self._announced_ns.get(label)
        if last is not None and now - last < ANNOUNCE_EVERY_S * 1e9:
            return tid, False
        self._announced_ns[label] = now
        return tid, True
