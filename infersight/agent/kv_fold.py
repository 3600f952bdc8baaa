"""KvFold: KV block events folded into transition counts, recomputed tokens and block ages.

A block's age can end in a later batch than the one it began in, so each block's open events
(its last birth and last "cached" since its last close) are carried from batch to batch. KV
reloads of requests still in flight are kept for the slow-request attribution.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.correlate import kv
from infersight.correlate.frames import EventFrames
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter, LabelledHistogram

#: Events that end a block's life, and those that open one (an age measured from it).
CLOSE_EVENTS = ("evicted", "freed")
OPEN_EVENTS = ("allocated", "reloaded", "cached")


class KvFold:
    def __init__(self, counters: dict[str, LabelledCounter], histograms: dict[str, LabelledHistogram]) -> None:
        self.counters, self.histograms = counters, histograms
        self.carry = EventFrames().kv_events  # each block's open events
        self.reload_events = EventFrames().kv_events  # KV reloads of requests still in flight

    def fold(self, events: pd.DataFrame, block_size: int) -> None:
        """Count one batch of kv_events; block_size turns recomputed blocks into tokens."""
        if events.empty:
            return
        counter = self.counters[C.KV_EVENTS.name]
        transitions = kv.transition_counts(events)
        for event, n in transitions.items():
            if n:
                counter.inc((event,), n)
        recomputed = transitions["recomputed"]  # kv.recomputed_blocks(events), counted once
        if recomputed:
            self.counters[C.KV_RECOMPUTED_TOKENS.name].inc((), recomputed * block_size)
        if transitions["reloaded"]:
            reloads = events[events["event"] == "reloaded"]
            self.reload_events = pd.concat([self.reload_events, reloads], ignore_index=True)
        # Ages that end in this batch may have started in an earlier one: measure over carry + new.
        window = pd.concat([self.carry, events], ignore_index=True) if not self.carry.empty else events
        hist = self.histograms[C.KV_AGE.name]
        # Per kind, sorted, rows in frame order (as groupby("kind") gives them, without its cost).
        ages = kv.block_lifetimes(window)
        codes, kinds = pd.factorize(ages["kind"], sort=True)
        seconds = ages["seconds"].to_numpy()
        for code, age_kind in enumerate(kinds.tolist()):
            hist.observe((str(age_kind),), seconds[codes == code])
        self.carry = self._open_events(window)

    @staticmethod
    def _open_events(window: pd.DataFrame) -> pd.DataFrame:
        """Each block's open events in window: its last allocated / reloaded / cached event (one of
        each) after its last close (evicted or freed), in window order. Plain numpy: this runs every
        poll, and a groupby costs ms."""
        # Each row's event as a small code, then tables over the few names (one string pass, not one a name).
        codes, names = pd.factorize(window["event"])  # a missing event: -1, the tables' last entry (neither)
        names = names.tolist()
        block = window["block_id"].to_numpy(np.int64)
        ts = window["ts_ns"].to_numpy(np.int64)
        closes = np.array([name in CLOSE_EVENTS for name in names] + [False])[codes]
        closed, inverse = np.unique(block[closes], return_inverse=True)
        last_close = np.full(len(closed), np.iinfo(np.int64).min, np.int64)
        np.maximum.at(last_close, inverse.reshape(-1), ts[closes])
        at = np.minimum(np.searchsorted(closed, block), max(len(closed) - 1, 0))
        has_close = (closed[at] == block) if len(closed) else np.zeros(len(block), bool)
        # Compared as floats, as the frame's mapped (NaN-able) close times were.
        after = ts.astype(np.float64) > np.where(has_close, last_close[at] if len(closed) else 0, -1).astype(np.float64)
        kind = np.array([OPEN_EVENTS.index(name) + 1 if name in OPEN_EVENTS else 0 for name in names] + [0])[codes]
        rows = np.flatnonzero(after & (kind > 0))
        # The last row of each (block, event) pair, kept in window order (groupby(...).tail(1)).
        order = np.lexsort((rows, kind[rows], block[rows]))
        b, k = block[rows][order], kind[rows][order]
        last = np.r_[(b[1:] != b[:-1]) | (k[1:] != k[:-1]), True] if len(order) else np.zeros(0, bool)
        return window.iloc[np.sort(rows[order][last])].reset_index(drop=True)

    def forget_reloads(self, request_ids: object) -> None:
        """The finished requests' reloads are no longer needed."""
        if not self.reload_events.empty:
            self.reload_events = self.reload_events[~self.reload_events["request_id"].isin(request_ids)]
