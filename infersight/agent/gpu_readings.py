"""GpuReadings: the energy-counter and SM-activity readings the energy account still needs.

Readings come from the GPU sampler every interval, whole-GPU only (MIG instances left out), for the
engine's GPUs. The energy counter is kept in microjoules as read; SM activity (a ratio gauge) is
integrated into nanoseconds of SM activity as it comes, so both are counters the account can read
at any time by interpolation (correlate.energy). Once the account has passed a time, the readings
before each GPU's last one at or before it are no longer needed (`trim`). The power gauge and the
counter's interval means give each GPU's highest power seen, which the sampling bound needs.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from infersight.correlate import energy as E
from infersight.gpu.samples import GpuSample

ENERGY_FIELD = "energy_joules"
SM_FIELD = "sm_active_ratio"
POWER_FIELD = "power_watts"


def _frame(rows: list[tuple[int, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["ts_ns", "gpu", "value"])


def last_at_or_before(counter: pd.DataFrame, ts_ns: int) -> pd.DataFrame:
    """The readings still needed once time before ts_ns is accounted: per GPU, from its last reading
    at or before ts_ns on."""
    if counter.empty:
        return counter
    floor = counter[counter["ts_ns"] <= ts_ns].groupby("gpu")["ts_ns"].max()
    keep = counter["ts_ns"] >= counter["gpu"].map(floor).fillna(np.iinfo(np.int64).min)
    return counter[keep].reset_index(drop=True)


class GpuReadings:
    """wanted: the GPUs whose energy is the engine's (empty: every GPU with an energy counter)."""

    def __init__(self, wanted: Iterable[int] = ()) -> None:
        self.wanted = set(wanted)
        self.gpus: tuple[int, ...] = ()  # fixed by the first energy readings
        self.energy = pd.DataFrame(columns=list(E.COUNTER_COLUMNS)).astype(E.COUNTER_COLUMNS)  # uJ
        self.sm = self.energy.copy()  # ns of SM activity
        self.newest: dict[tuple[str, int], int] = {}  # (field, gpu) -> newest reading taken in
        self._sm_last: dict[int, tuple[int, int]] = {}  # gpu -> (ts_ns, value) the SM integral stands at
        self.power_hi: dict[int, float] = {}  # gpu -> the most power seen (uJ per ns): interval means, gauge

    def add(self, samples: Iterable[GpuSample]) -> list[tuple[int, int, float]]:
        """Take in the energy and power readings not seen before; returns the new SM-activity readings
        (ts_ns, gpu, ratio), which integrate_sm keeps once the account has started."""
        new: dict[str, list[tuple[int, int, float]]] = {ENERGY_FIELD: [], SM_FIELD: []}
        seen: set[tuple[str, int, int]] = set()  # a reading repeated within one batch counts once
        for s in samples:
            if s.instance or (self.wanted and s.gpu not in self.wanted):
                continue
            if s.field == POWER_FIELD:  # the gauge widens the power range of the sampling bound
                self.power_hi[s.gpu] = max(self.power_hi.get(s.gpu, 0.0), s.value * 1e-3)
                continue
            if s.field not in new:
                continue
            key = (s.field, s.gpu)
            if s.ts_ns > self.newest.get(key, -1) and (s.field, s.gpu, s.ts_ns) not in seen:
                seen.add((s.field, s.gpu, s.ts_ns))
                new[s.field].append((s.ts_ns, s.gpu, s.value))
        for field, rows in new.items():
            for ts, gpu, _ in rows:
                self.newest[(field, gpu)] = max(ts, self.newest.get((field, gpu), -1))
        if new[ENERGY_FIELD]:
            rows = _frame(new[ENERGY_FIELD])
            rows = rows.assign(value=np.rint(rows["value"].to_numpy(np.float64) * 1e6)).astype(E.COUNTER_COLUMNS)
            if not self.gpus:
                self.gpus = tuple(sorted(rows["gpu"].unique().tolist()))
            rows = rows[rows["gpu"].isin(self.gpus)]
            self.energy = pd.concat([self.energy, rows], ignore_index=True)
            self._note_power()
        return new[SM_FIELD]

    def integrate_sm(self, readings: list[tuple[int, int, float]]) -> None:
        """SM-activity readings into the SM-active integral (ns), from where it stands."""
        if not readings:
            return
        gauge = _frame(readings)
        gauge = gauge[gauge["gpu"].isin(self.gpus)]
        integral = E.integrate_gauge(gauge, 1.0, self._sm_last)
        for gpu, ts, value in integral.groupby("gpu").tail(1)[["gpu", "ts_ns", "value"]].itertuples(index=False):
            self._sm_last[int(gpu)] = (int(ts), int(value))
        self.sm = pd.concat([self.sm, integral], ignore_index=True)

    def every_gpu_read(self) -> bool:
        """Whether each of the engine's GPUs has an energy reading (the account can start)."""
        return bool(self.gpus) and set(self.energy["gpu"]) >= set(self.gpus)

    def _note_power(self) -> None:
        """The highest mean power of any interval between two energy readings, per GPU (uJ per ns)."""
        for gpu, g in self.energy.groupby("gpu", sort=False):
            g = g.sort_values("ts_ns", kind="stable")
            dt = np.diff(g["ts_ns"].to_numpy(np.int64))
            dv = np.diff(np.maximum.accumulate(g["value"].to_numpy(np.int64)))
            if (dt > 0).any():
                self.power_hi[int(gpu)] = max(self.power_hi.get(int(gpu), 0.0), float((dv[dt > 0] / dt[dt > 0]).max()))

    def covered_ns(self, field: str) -> int:
        """Up to when every GPU has a reading of the field (-1: some GPU has none)."""
        return min((self.newest.get((field, g), -1) for g in self.gpus), default=-1)

    def trim(self, ts_ns: int) -> None:
        """Forget the readings the account no longer needs once it has passed ts_ns."""
        self.energy, self.sm = last_at_or_before(self.energy, ts_ns), last_at_or_before(self.sm, ts_ns)
