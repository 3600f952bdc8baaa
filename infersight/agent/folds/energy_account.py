"""EnergyAccount: the agent's side of GPU energy accounting (agent.energy_meter does the sums).

Steps go into the meter as their batch rows complete (with the PREFILL_CHUNK events that tell
their prefilling members from their decoding ones); the sampler's readings measure them; what no
step used is counted as idle energy. A finished request's row waits until its steps have been
measured (at most a few sampler intervals, EnergyMeter.ready), then takes its share: a modelled
split of measured energy, with the sampling interval's bound on it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from infersight.agent.energy_meter import REQUEST_ENERGY_FIELDS, EnergyMeter
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter
from infersight.gpu.samples import GpuSample


class EnergyAccount:
    def __init__(self, counters: dict[str, LabelledCounter], gpus: tuple[int, ...], wait_s: float,
                 fit_min_span_ns: int, hold_idle_static: bool = True) -> None:
        self.counters = counters
        # GPU energy over the steps, split by modelled cost; rows wait for it (at most a few sampler intervals).
        self.meter = EnergyMeter(gpus, wait_s=wait_s, fit_min_span_ns=fit_min_span_ns,
                                 hold_idle_static=hold_idle_static)

    def add_prefill_chunks(self, request_events: pd.DataFrame) -> None:
        """A poll's request events, before its steps: the meter keeps the PREFILL_CHUNK ones."""
        self.meter.add_prefill_chunks(request_events)

    def add_steps(self, steps: pd.DataFrame, batch: pd.DataFrame) -> None:
        """Steps with all their batch rows: measure what the readings so far cover."""
        self.meter.add_steps(steps, batch)
        self._count_idle(self.meter.attribute())

    def add_samples(self, samples: list[GpuSample]) -> bool:
        """The sampler's readings; True when finished rows are waiting for energy (build them now)."""
        self.meter.add_samples(samples)
        self._count_idle(self.meter.attribute())
        return self.meter.holding

    def close(self) -> None:
        """No more readings will come: the tail of the account is idle."""
        self._count_idle(self.meter.close())

    def _count_idle(self, idle_uj: int) -> None:
        if idle_uj:
            self.counters[C.ENERGY_IDLE.name].inc((), idle_uj / 1e6)

    def complete(self, done_ids: np.ndarray, open_events: pd.DataFrame) -> np.ndarray:
        """The finished requests whose steps' energy has been measured (all of them without a GPU
        energy counter); the rest wait in open_events (EnergyMeter.ready)."""
        if len(done_ids) == 0 or not self.meter.active:
            return done_ids
        fin = open_events[open_events["event"] == "FINISHED"].groupby("request_id")["ts_ns"].max()
        ids = [int(r) for r in done_ids]
        ready = self.meter.ready(ids, [int(fin.get(r, -1)) for r in ids])
        return np.asarray(ready, dtype=np.int64)

    def take(self, request_ids: Sequence[int]) -> dict[str, list[float]]:
        """Column -> values of each request (energy_meter.REQUEST_ENERGY_FIELDS), taken out of the
        account (NaN: not measured)."""
        if not self.meter.open:  # nothing measured (always so without a GPU): no per-row lookups
            return {c: [float("nan")] * len(request_ids) for c in REQUEST_ENERGY_FIELDS}
        measured = [self.meter.take(int(r)) for r in request_ids]
        return {c: [m[c] for m in measured] for c in REQUEST_ENERGY_FIELDS}

    def forget(self, request_ids: list[int]) -> None:
        self.meter.forget(request_ids)
