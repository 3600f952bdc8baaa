"""IdlePower: the GPU's idle power, read by the energy meter (agent.energy_meter) while no step runs.

The energy model holds its static power here once enough is read (correlate.token_cost: "dynamic"
then means the energy above idle, as a known answer measured from the counter defines it). What is
read, and why:
- settled idle only: from IDLE_SETTLE_NS after the last step ended (the power sensor averages: on the
  H200 a 5 s gap after a phase read 126.4 W whole, 124.0 W in its second half);
- whole reading intervals only: inside an interval the counter is interpolated linearly, so the part
  of an interval that also held steps reads their power (read so, the H200's idle came out 130-133 W
  against 122-126 W);
- a stretch the meter passes in pieces (one a poll, each shorter than a reading interval) is read as
  one: `read_to_ns` remembers how far it has been read.
Held once MIN_IDLE_READ_NS has been read. Readings are the meter's: the energy counter frame
(correlate.energy COUNTER_COLUMNS, summed over the GPUs) and the first GPU's reading times.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.correlate import energy as E

IDLE_SETTLE_NS = 1_000_000_000
MIN_IDLE_READ_NS = 3_000_000_000


class IdlePower:
    def __init__(self) -> None:
        self.busy_until_ns: int | None = None  # the end of the last step measured
        self.uj = 0  # energy read on settled idle time, and that time
        self.ns = 0
        self.read_to_ns = 0  # read up to this reading

    @property
    def watts(self) -> float | None:
        """The idle power read so far (W); None until MIN_IDLE_READ_NS of it has been read."""
        return self.uj / self.ns * 1e3 if self.ns >= MIN_IDLE_READ_NS else None  # uJ/ns = kW

    def read_gaps(self, counter: pd.DataFrame, reading_ns: np.ndarray, windows: pd.DataFrame, since_ns: int) -> None:
        """The gaps before each measured step window (sorted, disjoint; the first from the last busy
        time, or since_ns where the account began); the last window's end is then the last busy time."""
        if windows.empty:
            return
        ends = windows["end_ns"].to_numpy(np.int64)
        busy = np.concatenate(([self._last_busy_ns(since_ns)], ends[:-1]))
        self._read(counter, reading_ns, windows["start_ns"].to_numpy(np.int64), busy)
        self.busy_until_ns = int(ends.max())

    def read_until(self, counter: pd.DataFrame, reading_ns: np.ndarray, ts_ns: int, since_ns: int) -> None:
        """No step ran from the last busy time (or since_ns) to ts_ns."""
        self._read(counter, reading_ns, np.array([ts_ns]), np.array([self._last_busy_ns(since_ns)]))

    def _last_busy_ns(self, since_ns: int) -> int:
        # Before any step, where the account began: the GPU may have been busy just before.
        return self.busy_until_ns if self.busy_until_ns is not None else since_ns

    def _read(self, counter: pd.DataFrame, ts: np.ndarray, hi_ns: np.ndarray, busy_ns: np.ndarray) -> None:
        """Idle stretches (sorted) from busy to hi with no step in them: their whole reading intervals
        (ts: the first GPU's reading times, sorted) from busy + IDLE_SETTLE_NS on, not read before."""
        if len(ts) < 2 or len(hi_ns) == 0:
            return
        from_ns = busy_ns + IDLE_SETTLE_NS
        from_ns[0] = max(from_ns[0], self.read_to_ns)  # later stretches start after their own busy
        lo = ts[np.minimum(np.searchsorted(ts, from_ns, "left"), len(ts) - 1)]
        hi = ts[np.maximum(np.searchsorted(ts, hi_ns, "right") - 1, 0)]
        keep = hi > lo
        if not keep.any():
            return
        values = E.counter_at(counter, np.concatenate((lo[keep], hi[keep])))
        n = int(keep.sum())
        self.uj += int((values[n:] - values[:n]).sum())
        self.ns += int((hi[keep] - lo[keep]).sum())
        self.read_to_ns = max(self.read_to_ns, int(hi[keep].max()))
