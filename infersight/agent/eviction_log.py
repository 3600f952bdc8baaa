"""EvictionLog: who evicted whom in the KV pool, as the probe records say, bounded.

Our engine's pool (runtime/kv/kv_pool.py) emits EVICTED when it hands out a cached free block: the
event's request_id is the allocating request (the evictor). The content that was dropped is the
content the block's last CACHED event left behind: that event's request_id is the request whose
release cached it (the victim, whose prefix a later request can no longer hit). So each eviction
is joined to the block's last CACHED before it, per ring (block ids are a ring's own).

Kept: the last MAX_EVICTIONS evictions (ts, block, evictor, victim and their tasks), and counts by
(evictor task, victim task) since the start; the block -> last CACHED (request and its task) map and
the request -> task map are LRU-bounded (an id that fell out gives victim -1 / task "unknown", never a
wrong name). The victim's task is taken when its block is cached, so the request -> task map needs
only the requests that can still allocate (the evictors: requests in flight), not every request whose
block may still sit in the cache: at MAX_TASKS 65,536 it was ~120 B a request, ~7.7 MB once full, and
the agent's RSS grew for 55-84 minutes at 13-20 requests/s until it was (tracemalloc, BENCHMARKS.md).
Everything here is measured (probe records joined), nothing is modelled.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Any

import numpy as np

from infersight.agent.component import Component
from infersight.correlate.frames import EventFrames

#: Evictions kept for the API (the newest).
MAX_EVICTIONS = 1024
#: Blocks whose last CACHED owner is remembered (~100 B each: 6.5 MB at most). Our engine's pool is far
#: smaller; a vLLM ledger's ids go up to 2^18, and the least recently cached beyond this give victim -1.
MAX_BLOCKS = 1 << 16
#: Requests whose task is remembered, the newest arrivals: an evictor is a request in flight (a
#: request that arrived more than this many arrivals ago and still allocates is named "unknown").
MAX_TASKS = 1 << 13
UNKNOWN = "unknown"


class EvictionLog(Component):
    """An agent part: reads every batch's kv_events and request_events (after AgentState ingested them)."""

    name = "kv_evictions"

    def __init__(self, max_evictions: int = MAX_EVICTIONS, max_tasks: int = MAX_TASKS) -> None:
        self.max_tasks = max_tasks
        self.lock = threading.Lock()  # the HTTP thread reads while the poll thread writes
        self.recent: deque[dict[str, Any]] = deque(maxlen=max_evictions)
        self.by_tasks: dict[tuple[str, str], int] = {}
        self.total = 0
        self._last_cached: OrderedDict[tuple[int, int], tuple[int, str]] = OrderedDict()  # block -> (request, task)
        self._tasks: OrderedDict[tuple[int, int], str] = OrderedDict()

    def on_frames(self, frames: EventFrames, ring_index: int, anchor: tuple[int, int]) -> None:
        ev = frames.request_events
        if not ev.empty:
            arrived = ev[ev["event"] == "ARRIVED"]
            for rid, task in zip(arrived["request_id"].tolist(), arrived["task"].astype(str).tolist()):
                self._remember(self._tasks, (ring_index, int(rid)), task, self.max_tasks)
        kv = frames.kv_events
        if kv.empty:
            return
        names = kv["event"].astype(str).to_numpy()
        rows = np.flatnonzero((names == "cached") | (names == "evicted"))
        if not len(rows):
            return
        wall_ns, mono_ns = anchor
        ts, block, rid = (kv[c].to_numpy(np.int64)[rows] for c in ("ts_ns", "block_id", "request_id"))
        with self.lock:
            for name, t, b, r in zip(names[rows].tolist(), ts.tolist(), block.tolist(), rid.tolist()):
                key = (ring_index, b)
                if name == "cached":
                    self._remember(self._last_cached, key, (r, self._tasks.get((ring_index, r), UNKNOWN)), MAX_BLOCKS)
                    continue
                victim, victim_task = self._last_cached.pop(key, (-1, UNKNOWN))
                evictor_task = self._tasks.get((ring_index, r), UNKNOWN)
                self.recent.append({"wall_s": (wall_ns + t - mono_ns) / 1e9, "ring_index": ring_index, "block_id": b,
                                    "evictor_request_id": r, "evictor_task": evictor_task,
                                    "victim_request_id": victim, "victim_task": victim_task})
                pair = (evictor_task, victim_task)
                self.by_tasks[pair] = self.by_tasks.get(pair, 0) + 1
                self.total += 1

    @staticmethod
    def _remember(table: OrderedDict, key: tuple[int, int], value: Any, bound: int) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > bound:
            table.popitem(last=False)

    def document(self, limit: int) -> dict[str, Any]:
        """The newest `limit` evictions (newest last) and the counts by task pair, for the JSON API."""
        with self.lock:
            recent = list(self.recent)[-limit:] if limit > 0 else []
            pairs = [{"evictor_task": a, "victim_task": b, "evictions": n}
                     for (a, b), n in sorted(self.by_tasks.items(), key=lambda kv: -kv[1])]
            total = self.total
        self_evictions = sum(1 for e in recent if e["victim_request_id"] == e["evictor_request_id"] >= 0)
        return {"evictions_total": total, "by_task_pair": pairs, "recent": recent,
                "recent_self_evictions": self_evictions, "kept_at_most": self.recent.maxlen,
                "basis": "measured: EVICTED probe records (request = the allocating one) joined to the block's "
                         "last CACHED record (request = the one whose release cached the content)"}
