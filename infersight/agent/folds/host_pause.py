"""HostPauseFold: the engine process's garbage-collection pauses counted, and kept while a request
that lived through them may still finish.

Counted by generation, seconds and pauses; a pause the producer pushed out of its held ones (the
record after it says how many) is counted under generation "unknown", without seconds: its length
and generation went with it. The window keeps the pauses since the oldest request in flight, at most
MAX_HELD_PAUSES, for the slow-request attribution (correlate.slow_causes, host_pause).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.correlate.frames import EventFrames, concat_frames
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter

#: Pauses kept for the attribution, the newest: at 5 ms and more each, this many in the life
#: of one request in flight is a process that does little else (a request older than them loses its
#: oldest pauses from its host_pause figure).
MAX_HELD_PAUSES = 4096


class HostPauseFold:
    def __init__(self, counters: dict[str, LabelledCounter]) -> None:
        self.counters = counters
        self.window = EventFrames().host_pauses  # pauses since the oldest request in flight

    def fold(self, pauses: pd.DataFrame) -> None:
        """Count one batch of host_pauses rows and keep them for the attribution."""
        if pauses.empty:
            return
        generation = pauses["generation"].to_numpy(np.int64)
        seconds = (pauses["end_ns"] - pauses["ts_ns"]).to_numpy(np.int64)
        missed = pauses["missed"].to_numpy(np.int64)
        for g in np.unique(generation).tolist():
            at = generation == g
            label = (str(g),)
            self.counters[C.HOST_PAUSE_SECONDS.name].inc(label, float(seconds[at].sum()) / 1e9)
            self.counters[C.HOST_PAUSES.name].inc(label, int(at.sum()))
        if missed.any():
            self.counters[C.HOST_PAUSES.name].inc((C.HOST_PAUSE_MISSED,), int(missed.sum()))
        both = concat_frames([self.window, pauses]) if not self.window.empty else pauses
        self.window = both.iloc[-MAX_HELD_PAUSES:].reset_index(drop=True)

    def trim(self, oldest_open_ns: int | None) -> None:
        """Keep the pauses a request in flight may have lived through: those that ended after the
        oldest one arrived (None: no request in flight, none kept)."""
        if self.window.empty:
            return
        if oldest_open_ns is None:
            self.window = self.window.iloc[0:0]
        elif int(self.window["end_ns"].min()) < oldest_open_ns:
            self.window = self.window[self.window["end_ns"].to_numpy(np.int64) >= oldest_open_ns].reset_index(drop=True)
