"""NetworkHold: the rows of requests served over HTTP wait for their NETWORK record.

`infersight serve` writes a SERVED record when a request arrives and a NETWORK record after the
response's last byte, which goes out after the engine's FINISHED event. A served request's row is
held until its NETWORK record comes (or, if that is lost to ring drops or a server crash, until a
wait runs out), so that its e2e ends at the last byte. Both tables are bounded.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from infersight.correlate.frames import EventFrames

#: Requests in flight tracked at most (records of requests that never finish are forgotten oldest first).
MAX_OPEN_REQUESTS = 50_000


class NetworkHold:
    """Served requests (id -> when their row was first held, 0: not yet) and their network timing."""

    def __init__(self) -> None:
        self.awaiting: dict[int, float] = {}  # served request id -> when its row was first held (0: not yet)
        self.timing: dict[int, tuple[int, int]] = {}  # request id -> (receive_ns, last_byte_ns)

    def note(self, frames: EventFrames) -> None:
        """Note served requests (SERVED, written at arrival) and their timing (NETWORK, after the last
        byte). Both tables are bounded: records of requests that never finish are forgotten oldest first."""
        if not frames.served.empty:
            for rid in frames.served["request_id"].tolist():
                self.awaiting.setdefault(int(rid), 0.0)
        if not frames.network.empty:
            for rid, recv, last in frames.network[["request_id", "receive_ns", "last_byte_ns"]].itertuples(index=False):
                self.timing[int(rid)] = (int(recv), int(last))
        for table in (self.awaiting, self.timing):
            while len(table) > MAX_OPEN_REQUESTS:
                del table[next(iter(table))]

    def release(self, done_ids: np.ndarray, wait_s: float) -> np.ndarray:
        """The finished requests whose row can be computed now. A served request's last byte goes out
        after its FINISHED event, so its row waits (in the open events) for the NETWORK record; if that
        never comes it goes without after wait_s."""
        if not self.awaiting:
            return done_ids
        now, ready = time.monotonic(), []
        for rid in done_ids.tolist():
            since = self.awaiting.get(rid)
            if since is not None and rid not in self.timing:
                if since == 0.0:
                    self.awaiting[rid] = since = now
                if now - since < wait_s:
                    continue
            ready.append(rid)
        return np.asarray(ready, dtype=np.int64)

    def take_rows(self, done_ids: np.ndarray, done: pd.DataFrame) -> pd.DataFrame:
        """request_table's network frame for done_ids (receive and last byte; the last byte ends e2e),
        taking their entries out of the tables. A client that hung up mid-response had its last byte
        before the engine aborted the request: the response then ends at the abort (network >= 0)."""
        rows = []
        finished = None  # FINISHED times, only once some request has network timing (most have none)
        for rid in done_ids.tolist() if self.awaiting or self.timing else ():
            self.awaiting.pop(rid, None)
            timing = self.timing.pop(rid, None)
            if timing is not None:
                if finished is None:
                    finished = done[done["event"] == "FINISHED"].groupby("request_id")["ts_ns"].min()
                rows.append((rid, timing[0], max(timing[1], int(finished.get(rid, timing[1])))))
        return pd.DataFrame(rows, columns=["request_id", "receive_ns", "send_end_ns"]).astype("int64")
