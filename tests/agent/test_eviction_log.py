"""EvictionLog on a tiny case: an eviction is joined to its block's last CACHED, and the victim's
task is the one it had when it cached the block, even after its arrival left the task table."""
from __future__ import annotations

import dataclasses

import pandas as pd

from infersight.agent.eviction_log import EvictionLog
from infersight.correlate.frames import EventFrames


def _frames(arrived: list[tuple[int, str]] = (), kv: list[tuple[str, int, int]] = ()) -> EventFrames:
    """ARRIVED events (request, task); KV events (event, block, request)."""
    empty = EventFrames()
    req = pd.DataFrame([{"ts_ns": 1, "end_ns": 1, "request_id": r, "trace_id": "", "task": t, "event": "ARRIVED",
                         "reason": "", "value0": 0, "value1": 0} for r, t in arrived], columns=empty.request_events.columns)
    ev = pd.DataFrame([{"ts_ns": 10 + i, "event": e, "block_id": b, "request_id": r, "block_hash": 0}
                       for i, (e, b, r) in enumerate(kv)], columns=empty.kv_events.columns)
    return dataclasses.replace(empty, request_events=req.astype(empty.request_events.dtypes.to_dict()),
                               kv_events=ev.astype(empty.kv_events.dtypes.to_dict()))


def test_the_victims_task_is_kept_with_its_cached_block() -> None:
    log = EvictionLog(max_tasks=2)
    log.on_frames(_frames(arrived=[(1, "chat")], kv=[("cached", 7, 1)]), 0, (0, 0))
    # Two more arrivals push request 1 out of the task table (max 2); request 3 evicts block 7.
    log.on_frames(_frames(arrived=[(2, "code"), (3, "json")], kv=[("evicted", 7, 3), ("evicted", 8, 2)]), 0, (0, 0))
    doc = log.document(10)
    assert [(e["block_id"], e["evictor_request_id"], e["evictor_task"], e["victim_request_id"], e["victim_task"])
            for e in doc["recent"]] == [(7, 3, "json", 1, "chat"), (8, 2, "code", -1, "unknown")]
    assert doc["evictions_total"] == 2
    assert {(p["evictor_task"], p["victim_task"]): p["evictions"] for p in doc["by_task_pair"]} == {
        ("json", "chat"): 1, ("code", "unknown"): 1}
    # The task table kept the newest two arrivals only.
    assert list(log._tasks) == [(0, 2), (0, 3)]
