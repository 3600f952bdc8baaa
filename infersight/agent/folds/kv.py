"""KvFold: KV block events folded into transition counts, recomputed tokens and block ages.

A block's age can end in a later batch than the one it began in, so each block's open events
(its last birth and last "cached" since its last close) are carried from batch to batch. KV
reloads of requests still in flight are kept for the slow-request attribution.

Both are bounded in rows (KvLimits), whatever the producer sends: a block that never closes (a
hash vLLM keeps cached, or whose eviction was lost; a synthetic id the vLLM ledger forgot) or a
request whose FINISHED was lost would otherwise stay forever. Past a bound the oldest rows go,
counted in kv_tracking_dropped{reason="open_events"|"reloads"}: a dropped open event's block gets
no age when it closes (its transition is still counted); a dropped reload is not seen by the
slow-request attribution.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from infersight.correlate import kv
from infersight.correlate.frames import EventFrames
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter, LabelledHistogram

#: Events that end a block's life, and those that open one (an age measured from it).
CLOSE_EVENTS = ("evicted", "freed")
OPEN_EVENTS = ("allocated", "reloaded", "cached")


@dataclass(frozen=True)
class KvLimits:
    """max_open_events: open events carried between polls (at most 3 a block: our engine's pool
    needs 3 x its blocks; vLLM's events one per cached copy, whose ledger remembers at most 2^18 ids).
    max_reloads: reload rows of requests in flight. About 40 bytes a row in the frames."""

    max_open_events: int = 1 << 18
    max_reloads: int = 1 << 16

    def __post_init__(self) -> None:
        if self.max_open_events < 1 or self.max_reloads < 1:
            raise ValueError(f"KV limits must be >= 1, got {self}")


class KvFold:
    def __init__(self, counters: dict[str, LabelledCounter], histograms: dict[str, LabelledHistogram],
                 limits: KvLimits = KvLimits(), seed_zero_series: bool = True) -> None:
        """seed_zero_series: False where the series are seeded per engine (agent.rings.engine_scope)."""
        self.counters, self.histograms, self.limits = counters, histograms, limits
        self.carry = EventFrames().kv_events  # each block's open events
        self.reload_events = EventFrames().kv_events  # KV reloads of requests still in flight
        if seed_zero_series:
            self.seed_zero_series()

    def seed_zero_series(self) -> None:
        """A 0 sample of each drop reason from the start, not a missing series."""
        dropped = self.counters[C.KV_TRACKING_DROPPED.name]
        for reason in C.KV_DROP_REASONS:
            dropped.inc((reason,), 0)

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
            self.reload_events = self._bounded(pd.concat([self.reload_events, reloads], ignore_index=True),
                                               self.limits.max_reloads, "reloads")
        # Ages that end in this batch may have started in an earlier one: measure over the carried
        # open events of the blocks this batch touches, then the batch. A block it does not touch has
        # no age ending here (its carried rows hold no close) and keeps its rows as they are, so a
        # poll costs the batch, not the carry (which, for vLLM, is every cached block).
        carry = self.carry
        touched = np.isin(carry["block_id"].to_numpy(np.int64), events["block_id"].to_numpy(np.int64))
        n_touched = int(touched.sum())
        window = pd.concat([carry[touched], events], ignore_index=True) if n_touched else events
        hist = self.histograms[C.KV_AGE.name]
        # Per kind, sorted, rows in frame order (as groupby("kind") gives them, without its cost).
        ages = kv.block_lifetimes(window)
        codes, kinds = pd.factorize(ages["kind"], sort=True)
        seconds = ages["seconds"].to_numpy()
        for code, age_kind in enumerate(kinds.tolist()):
            hist.observe((str(age_kind),), seconds[codes == code])
        # The open events of carry + batch, in that order (what _open_events of the whole would give).
        rows = self._open_rows(window)
        kept = np.sort(np.r_[np.flatnonzero(~touched), np.flatnonzero(touched)[rows[rows < n_touched]]])
        new = events.iloc[rows[rows >= n_touched] - n_touched]
        opened = pd.concat([carry.iloc[kept], new], ignore_index=True) if len(kept) else new.reset_index(drop=True)
        self.carry = self._bounded(opened, self.limits.max_open_events, "open_events")

    def _bounded(self, frame: pd.DataFrame, limit: int, reason: str) -> pd.DataFrame:
        """frame's last `limit` rows (it is in event order: the oldest go), the rest counted as dropped."""
        over = len(frame) - limit
        if over <= 0:
            return frame
        self.counters[C.KV_TRACKING_DROPPED.name].inc((reason,), over)
        return frame.iloc[over:].reset_index(drop=True)

    @staticmethod
    def _open_events(window: pd.DataFrame) -> pd.DataFrame:
        """Each block's open events in window: its last allocated / reloaded / cached event (one of
        each) after its last close (evicted or freed), in window order."""
        return window.iloc[KvFold._open_rows(window)].reset_index(drop=True)

    @staticmethod
    def _open_rows(window: pd.DataFrame) -> np.ndarray:
        """The positions of _open_events' rows in window, ascending. Plain numpy: this runs every
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
        return np.sort(rows[order][last])

    def forget_reloads(self, request_ids: object) -> None:
        """The finished requests' reloads are no longer needed."""
        if not self.reload_events.empty:
            self.reload_events = self.reload_events[~self.reload_events["request_id"].isin(request_ids)]
