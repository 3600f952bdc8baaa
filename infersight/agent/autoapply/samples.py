"""RequestSamples: each finished request's latency, task and canary arm, read from the probe records.

What the loop measures is what the requests saw, on the engine's monotonic clock (one host: the
agent reads the engine's shared-memory ring, so the clock is the same system-wide CLOCK_MONOTONIC):

    ttft_s  FIRST_TOKEN - ARRIVED
    tpot_s  (FINISHED - FIRST_TOKEN) / (output tokens - 1): the per-output-token latency of decode,
            what speculation changes (NaN for a request of one token)
    arm     POLICY_ARM's value0 (runtime PolicyArm: 0 none, 1 treatment, 2 control); seq its value1,
            the policy generation in force when the request arrived (0: no policy record)

`frame()` columns: request_id, task, arm, seq, arrived_ns, finished_ns, output_tokens, ttft_s, tpot_s.
Bounded: at most `max_open` requests waiting for their FINISHED (the oldest forgotten) and the last
`max_finished` finished ones.
"""
from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np
import pandas as pd

from infersight.correlate.frames import EventFrames

COLUMNS = ("request_id", "task", "arm", "seq", "arrived_ns", "finished_ns", "output_tokens", "ttft_s", "tpot_s")
_WANTED = ("ARRIVED", "FIRST_TOKEN", "FINISHED", "POLICY_ARM")


class RequestSamples:
    def __init__(self, max_open: int = 65536, max_finished: int = 20000) -> None:
        self.max_open = max_open
        self._open: OrderedDict[tuple[int, int], dict[str, object]] = OrderedDict()
        self._done: deque[tuple[object, ...]] = deque(maxlen=max_finished)

    def add(self, frames: EventFrames, ring_index: int = 0) -> None:
        """Fold one ring's batch in (request ids are per ring: keyed by (ring, id))."""
        ev = frames.request_events
        if ev.empty:
            return
        ev = ev[ev["event"].isin(_WANTED)]
        for rid, event, ts, task, v0, v1 in zip(ev["request_id"].tolist(), ev["event"].tolist(), ev["ts_ns"].tolist(),
                                                 ev["task"].tolist(), ev["value0"].tolist(), ev["value1"].tolist()):
            key = (ring_index, rid)
            row = self._open.get(key)
            if row is None:
                if event != "ARRIVED":
                    continue  # attached mid-request: no arrival to measure from
                row = self._open[key] = {"task": str(task), "arrived_ns": ts, "arm": 0, "seq": 0, "first_ns": None}
                if len(self._open) > self.max_open:
                    self._open.popitem(last=False)
            if event == "POLICY_ARM":
                row["arm"], row["seq"] = int(v0), int(v1)
            elif event == "FIRST_TOKEN":
                row["first_ns"] = ts
            elif event == "FINISHED":
                del self._open[key]
                self._finish(rid, row, ts, int(v0))

    def _finish(self, rid: int, row: dict[str, object], finished_ns: int, tokens: int) -> None:
        first, arrived = row["first_ns"], int(row["arrived_ns"])  # type: ignore[call-overload]
        if first is None:
            return  # ended before its first token (aborted, failed): no latency to speak of
        ttft = (int(first) - arrived) / 1e9  # type: ignore[call-overload]
        tpot = (finished_ns - int(first)) / 1e9 / (tokens - 1) if tokens > 1 else float("nan")  # type: ignore[call-overload]
        self._done.append((rid, row["task"], row["arm"], row["seq"], arrived, finished_ns, tokens, ttft, tpot))

    def frame(self) -> pd.DataFrame:
        """The finished requests kept, oldest first (columns: COLUMNS)."""
        frame = pd.DataFrame(list(self._done), columns=list(COLUMNS))
        for col in ("ttft_s", "tpot_s"):
            frame[col] = frame[col].astype(np.float64)
        return frame
