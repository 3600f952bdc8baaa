"""EnergyMeter: the agent's running account of GPU energy (and SM activity) over the engine's steps.

The GPU sampler reads the total-energy counter (NVML nvmlDeviceGetTotalEnergyConsumption, DCGM
field 156, dcgm-exporter DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION; all in joules once collected) every
interval, not every step. The meter keeps those readings and, once a reading after a step's end
has come, measures the step's window on the interpolated counter (correlate.energy) and splits
it over the step's requests by their modelled cost (correlate.token_cost: the GPU's static power
and dynamic joules per prefill, decode and draft token, fitted on the measured energy of the
counter's intervals so far; token share until that fit can tell them apart). Once the fit is
usable a step's energy is also cut into its dynamic and static parts (token_cost.step_dynamic_share),
each split over the requests by the same weights, so a request's energy_j = dynamic + static
exactly. A request's joules are therefore a modelled split of measured energy; with
them goes the most the counter's sampling interval can have moved into or out of them
(correlate.sampling_bound). Time it has accounted for ends at `cursor_ns`; what accrued between
steps is idle energy:

    first reading ........ step ... gap ... step ......... cursor_ns ..... newest reading
    |<-- requests_uj (in steps) + idle_uj (gaps) == counter(cursor) - counter(first) -->|

The SM-active integral (GPM or DCGM SM activity x time, summed over GPUs) is split the same way
where its readings cover a step; without them a request's figure is NaN. The readings the account
still needs are kept by gpu_readings.GpuReadings, the energy model's fit by energy_fit.EnergyFit. Finished requests wait
(AgentState asks `ready`) until the account has passed their finish, at most `wait_s`.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from infersight.agent.energy_fit import EnergyFit
from infersight.agent.gpu_readings import ENERGY_FIELD, SM_FIELD, GpuReadings
from infersight.agent.idle_power import IdlePower
from infersight.correlate import cost
from infersight.correlate import energy as E
from infersight.correlate import sampling_bound as B
from infersight.correlate import token_cost as T
from infersight.gpu.samples import GpuSample

#: What `EnergyMeter.take` gives each finished request (columns of its row): energy_j = energy_dynamic_j
#: + energy_static_j (the step's energy cut by the model: static W x step time, the rest dynamic, with the
#: static power held at the measured idle power; in the fitted model's proportion otherwise), each split
#: over the step's requests by modelled cost.
REQUEST_ENERGY_FIELDS = ("energy_j", "energy_dynamic_j", "energy_static_j", "gpu_sm_active_s",
                         "energy_sampling_bound_j")
#: Bounds on what waits for readings (steps), for its step (prefill chunks) or for its request to
#: finish (open shares).
MAX_PENDING_STEPS = 20_000
MAX_PENDING_CHUNKS = 100_000
MAX_OPEN_REQUESTS = 50_000
#: With no step waiting, idle time is accounted up to this long before now: a step that already ran
#: may not have been read from its ring yet, and its window must not have been counted as idle.
IDLE_LAG_NS = 2_000_000_000


def _int_frame(*columns: str) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})


class EnergyMeter:
    """gpus: the GPUs whose energy is the engine's (() = every GPU with an energy counter)."""

    def __init__(self, gpus: tuple[int, ...] = (), wait_s: float = 5.0,
                 clock: Callable[[], int] = time.monotonic_ns, fit_min_span_ns: int = 0,
                 hold_idle_static: bool = False) -> None:
        self.wait_ns = int(wait_s * 1e9)
        self._clock = clock
        self.readings = GpuReadings(gpus)  # energy and SM activity as read, until accounted
        self.from_ns: int | None = None
        self.from_uj = 0  # the counter, summed over the GPUs, at from_ns
        self.cursor_ns: int | None = None
        self.requests_uj = 0  # energy of steps, all given to their requests
        self.idle_uj = 0
        self.steps_measured = 0
        self.steps_dropped = 0  # waited past MAX_PENDING_STEPS: their energy went to idle
        self.rows_timed_out = 0
        # Steps (and their batch rows) not yet covered by a reading. Plain frames, not EventFrames:
        # building one makes every stream's empty frame, which costs more than this whole meter's poll.
        self.pending_steps = _int_frame("step_id", "start_ns", "end_ns", "batch_size",
                                        *T.STEP_KIND_COLUMNS.values())
        self.pending_batch = _int_frame("step_id", "request_id", "num_tokens")
        self.chunks = _int_frame("request_id", "ts_ns")  # PREFILL_CHUNK events of steps not yet measured
        self.fit = EnergyFit(fit_min_span_ns)  # the energy model, refitted on each complete counter interval
        # The GPU's idle power, read on settled idle time; the model's static power is held at it once
        # enough is read (agent.idle_power), if hold_idle_static.
        self.hold_idle_static = hold_idle_static
        self.idle = IdlePower()
        self.steps_by_model = 0  # steps split by modelled cost
        self.steps_by_tokens = 0  # steps split by token share (no usable fit yet, or members not told apart)
        # requests_uj cut by the model into dynamic and static (steps split with a usable fit); the
        # rest of requests_uj was split before the fit was usable and has no such cut.
        self.dynamic_uj = 0
        self.static_uj = 0
        self.bound_open = B.merge_shares(pd.DataFrame())  # sampling-bound shares of intervals still open
        self.bound_taken_uj = 0.0  # the sampling bounds of the requests taken, summed
        # request id -> [energy uJ, SM-active ns, bound uJ, dynamic uJ] (NaN: none; dynamic stays NaN once
        # one of its steps had no usable fit: its static part is then unknown)
        self.open: dict[int, list[float]] = {}
        self._held: dict[int, int] = {}  # request id -> when its row was first held (monotonic ns)
        self.closed = False

    @property
    def active(self) -> bool:
        """Whether an energy counter has been read (never, on a CPU-only host)."""
        return self.cursor_ns is not None

    # -- readings ---------------------------------------------------------------------------------
    def add_samples(self, samples: Iterable[GpuSample]) -> None:
        """Take in the readings not seen before (whole-GPU energy and SM activity only)."""
        sm = self.readings.add(samples)
        if self.cursor_ns is None and self.readings.every_gpu_read():
            # Every GPU has a reading from here on: the account starts.
            energy = self.readings.energy
            self.from_ns = self.cursor_ns = int(energy.groupby("gpu")["ts_ns"].min().max())
            self.from_uj = int(E.counter_at(energy, np.array([self.from_ns]))[0])
        if self.active:
            self.readings.integrate_sm(sm)

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.readings.gpus

    # -- steps --------------------------------------------------------------------------------------
    def add_steps(self, steps: pd.DataFrame, batch: pd.DataFrame) -> None:
        """Queue complete steps (all their batch rows) for measuring; ignored until the account starts."""
        if not self.active or steps.empty:
            return
        new_batch = batch[batch["step_id"].isin(steps["step_id"])][list(self.pending_batch.columns)]
        steps = pd.concat([self.pending_steps, steps[list(self.pending_steps.columns)]], ignore_index=True)
        batch = pd.concat([self.pending_batch, new_batch], ignore_index=True)
        if len(steps) > MAX_PENDING_STEPS:  # readings stopped coming: the oldest steps go unmeasured
            self.steps_dropped += len(steps) - MAX_PENDING_STEPS
            steps = steps.iloc[-MAX_PENDING_STEPS:].reset_index(drop=True)
            batch = batch[batch["step_id"].isin(steps["step_id"])].reset_index(drop=True)
        self.pending_steps, self.pending_batch = steps, batch

    def add_prefill_chunks(self, request_events: pd.DataFrame) -> None:
        """Keep the PREFILL_CHUNK events (the engine writes them before their step's record): they
        tell a step's prefilling members from its decoding ones (token_cost.member_tokens)."""
        if not self.active or request_events.empty:
            return
        ev = request_events[request_events["event"].to_numpy() == "PREFILL_CHUNK"]
        if not ev.empty:
            self.chunks = pd.concat([self.chunks, ev[["request_id", "ts_ns"]].astype("int64")],
                                    ignore_index=True).iloc[-MAX_PENDING_CHUNKS:]

    def attribute(self) -> int:
        """Measure the queued steps that a reading now covers; returns the idle uJ newly accounted
        (gaps between them, and steps that ran no request)."""
        covered = self.readings.covered_ns(ENERGY_FIELD)
        steps = self.pending_steps
        if self.cursor_ns is None or covered < 0:
            return 0
        if steps.empty:
            return self._idle_until(min(covered, self._clock() - IDLE_LAG_NS))
        ready = steps[steps["end_ns"].to_numpy(np.int64) <= covered]
        if ready.empty:
            return 0
        start, to_ns = self.cursor_ns, max(self.cursor_ns, int(ready["end_ns"].max()))
        windows, idle = E.step_values(ready, self.readings.energy, start, to_ns)
        self.idle.read_gaps(self.readings.energy, self._first_gpu_readings(), windows, int(self.from_ns or 0))
        measured = windows[["step_id"]].assign(energy_uj=windows["value"].astype(np.float64),
                                               gpu_sm_active_ns=np.nan)
        sm_covered = self.readings.covered_ns(SM_FIELD)
        if sm_covered >= 0 and self.readings.sm["ts_ns"].min() <= start:
            sm_windows, _ = E.step_values(ready, self.readings.sm, start, to_ns)
            measured["gpu_sm_active_ns"] = np.where(sm_windows["end_ns"] <= sm_covered,
                                                    sm_windows["value"].astype(np.float64), np.nan)
        done = self.pending_batch["step_id"].isin(ready["step_id"])
        batch = self.pending_batch[done].reset_index(drop=True)
        per_step = measured.set_index("step_id")
        weight = self._weights(ready, windows, batch, to_ns)
        energy_uj, dynamic_uj = self._split_energy(ready, windows, batch, weight)
        sm_ns = cost.split_in_proportion(batch, weight, per_step["gpu_sm_active_ns"])
        for rid, e, d, s in zip(batch["request_id"].tolist(), energy_uj.tolist(), dynamic_uj.tolist(), sm_ns.tolist()):
            acc = self.open.setdefault(int(rid), [0.0, float("nan"), 0.0, 0.0])
            acc[0] += e
            acc[3] += d  # NaN sticks
            if s == s:  # not NaN
                acc[1] = s if acc[1] != acc[1] else acc[1] + s
        self._add_bounds(windows, batch, weight, to_ns)
        shared = int(np.nansum(energy_uj))
        idle += int(windows["value"].sum()) - shared  # steps that ran nobody
        self.requests_uj += shared
        self.idle_uj += idle
        self.steps_measured += len(windows)
        self.cursor_ns = to_ns
        self.pending_steps = steps[~steps["step_id"].isin(ready["step_id"])].reset_index(drop=True)
        self.pending_batch = self.pending_batch[~done].reset_index(drop=True)
        oldest = min(to_ns, int(self.pending_steps["start_ns"].min()) if not self.pending_steps.empty else to_ns)
        self.chunks = self.chunks[self.chunks["ts_ns"].to_numpy(np.int64) >= oldest].reset_index(drop=True)
        self.readings.trim(to_ns)
        while len(self.open) > MAX_OPEN_REQUESTS:  # requests that never finish
            self.forget([next(iter(self.open))])
        return idle

    def _weights(self, ready: pd.DataFrame, windows: pd.DataFrame, batch: pd.DataFrame, to_ns: int) -> np.ndarray:
        """Each batch row's weight in its step (token_cost.member_weights), the energy model first
        refitted with the counter intervals these steps complete."""
        self._refit(ready, windows, to_ns)
        members = T.member_tokens(ready, batch, self.chunks)
        modelled = int(members.drop_duplicates("step_id")["resolved"].sum()) if self.costs.usable else 0
        self.steps_by_model += modelled
        self.steps_by_tokens += int(members["step_id"].nunique()) - modelled
        return T.member_weights(members, self.costs)

    def _split_energy(self, ready: pd.DataFrame, windows: pd.DataFrame, batch: pd.DataFrame,
                      weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(energy uJ, dynamic uJ) of each batch row. A step's measured energy E is cut into dynamic
        D = rint(E x its modelled dynamic share) and static E - D (token_cost.step_dynamic_share), and
        each is split by `weight` (largest remainder), so a row's energy = its dynamic + its static,
        both >= 0, and the rows of a step sum to E exactly. A step without a usable fit is split whole;
        its rows' dynamic part is NaN."""
        step = ready[["step_id", *T.STEP_KIND_COLUMNS.values()]].merge(
            windows[["step_id", "start_ns", "end_ns", "value"]], on="step_id")
        value = pd.Series(step["value"].to_numpy(np.int64), index=step["step_id"].to_numpy(np.int64))
        whole = cost.split_in_proportion(batch, weight, value)
        share = T.step_dynamic_share(step, self.costs, step["value"].to_numpy(np.float64))
        if np.isnan(share).all():
            return whole, np.full(len(batch), np.nan)
        dynamic = pd.Series(np.rint(value.to_numpy() * share), index=value.index)  # NaN: no usable fit
        dynamic_uj = cost.split_in_proportion(batch, weight, dynamic)
        static_uj = cost.split_in_proportion(batch, weight, value - dynamic)
        energy_uj = np.where(np.isnan(dynamic_uj), whole, dynamic_uj + static_uj)
        cut = dynamic.notna().to_numpy() & step["step_id"].isin(batch["step_id"]).to_numpy()  # nobody's: idle
        self.dynamic_uj += int(dynamic[cut].sum())
        self.static_uj += int((value - dynamic)[cut].sum())
        return energy_uj, dynamic_uj

    def _refit(self, ready: pd.DataFrame, windows: pd.DataFrame, to_ns: int) -> None:
        """The measured steps that ran a batch into the fit, over the first GPU's reading intervals."""
        ran = ready[ready["batch_size"].to_numpy(np.int64) > 0]
        measured = ran[["step_id", *T.STEP_KIND_COLUMNS.values()]].merge(
            windows[["step_id", "start_ns", "end_ns", "value"]], on="step_id").rename(columns={"value": "energy_uj"})
        self.fit.add(measured, self._first_gpu_readings(), to_ns, self.idle_w if self.hold_idle_static else None)

    @property
    def costs(self) -> T.TokenCosts:
        """The fit the last steps were split by."""
        return self.fit.costs

    def _add_bounds(self, windows: pd.DataFrame, batch: pd.DataFrame, weight: np.ndarray, to_ns: int) -> None:
        """Each member's share of its step's window, into the sampling-bound shares; intervals that
        end by to_ns are complete (no later step falls in them) and become each request's bound."""
        total = pd.Series(weight).groupby(batch["step_id"].to_numpy()).transform("sum").to_numpy(np.float64)
        w = batch[["step_id", "request_id"]].assign(share=np.divide(weight, total, out=np.zeros(len(total)),
                                                                    where=total > 0))
        w = w.merge(windows[["step_id", "start_ns", "end_ns"]], on="step_id")
        shares = B.merge_shares(pd.concat([self.bound_open, B.interval_shares(w, self.readings.energy)], ignore_index=True))
        complete = (shares["t0_ns"] + shares["dt_ns"]).to_numpy(np.int64) <= to_ns
        for rid, bound in zip(shares.loc[complete, "request_id"].tolist(), self._bounds(shares[complete]).tolist()):
            if rid in self.open:
                self.open[rid][2] += bound
        self.bound_open = shares[~complete].reset_index(drop=True)

    def _bounds(self, shares: pd.DataFrame) -> np.ndarray:
        """sampling_bound.interval_bounds with the GPU's power between 0 W and the most seen so far."""
        hi = shares["gpu"].map(self.readings.power_hi).fillna(0.0).to_numpy(np.float64)
        return B.interval_bounds(shares, 0.0, hi)

    @property
    def idle_w(self) -> float | None:
        """The GPU's idle power (W, over the engine's GPUs) as read so far (IdlePower.watts)."""
        return self.idle.watts

    def _first_gpu_readings(self) -> np.ndarray:
        energy = self.readings.energy
        return np.sort(energy.loc[energy["gpu"].to_numpy(np.int64) == self.gpus[0], "ts_ns"].to_numpy(np.int64))

    def _idle_until(self, ts_ns: int) -> int:
        """Count [cursor, ts_ns] as idle (no step ran in it); returns the uJ added."""
        if self.cursor_ns is None or ts_ns <= self.cursor_ns:
            return 0
        self.idle.read_until(self.readings.energy, self._first_gpu_readings(), ts_ns, int(self.from_ns or 0))
        ends = E.counter_at(self.readings.energy, np.array([self.cursor_ns, ts_ns]))
        self.idle_uj += int(ends[1] - ends[0])
        self.cursor_ns = ts_ns
        self.readings.trim(ts_ns)
        return int(ends[1] - ends[0])

    # -- requests -----------------------------------------------------------------------------------
    def ready(self, request_ids: list[int], finish_ns: list[int]) -> list[int]:
        """The finished requests whose energy is complete: the account has passed their finish, or
        it cannot (no energy counter, readings stale for wait_s, the meter closed), or they waited
        wait_s. The others are held; ask again later."""
        newest = max((ts for (f, _), ts in self.readings.newest.items() if f == ENERGY_FIELD), default=-1)
        now = self._clock()
        if self.cursor_ns is None or self.closed or now - newest > self.wait_ns:
            for rid in request_ids:
                self._held.pop(rid, None)
            return list(request_ids)
        out = []
        for rid, fin in zip(request_ids, finish_ns):
            since = self._held.setdefault(rid, now)
            if fin <= self.cursor_ns or now - since >= self.wait_ns:
                self.rows_timed_out += fin > self.cursor_ns
                self._held.pop(rid)
                out.append(rid)
        return out

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def take(self, request_id: int) -> dict[str, float]:
        """A finished request's REQUEST_ENERGY_FIELDS (joules, seconds); NaN where nothing was
        measured (energy_dynamic_j and energy_static_j: also where a step of it was split before the
        fit was usable). Its part of an interval still open counts as it stands: it has finished."""
        acc = self.open.pop(int(request_id), None)
        if acc is None:
            return dict.fromkeys(REQUEST_ENERGY_FIELDS, float("nan"))
        mine = self.bound_open["request_id"].to_numpy(np.int64) == int(request_id)
        if mine.any():
            acc[2] += float(self._bounds(self.bound_open[mine]).sum())
            self.bound_open = self.bound_open[~mine].reset_index(drop=True)
        self.bound_taken_uj += acc[2]
        return {"energy_j": acc[0] / 1e6, "energy_dynamic_j": acc[3] / 1e6, "energy_static_j": (acc[0] - acc[3]) / 1e6,
                "gpu_sm_active_s": acc[1] / 1e9, "energy_sampling_bound_j": acc[2] / 1e6}

    def forget(self, request_ids: Iterable[int]) -> None:
        ids = [int(r) for r in request_ids]
        for rid in ids:
            self.open.pop(rid, None)
            self._held.pop(rid, None)
        if ids and not self.bound_open.empty:
            self.bound_open = self.bound_open[~self.bound_open["request_id"].isin(ids)].reset_index(drop=True)

    def close(self) -> int:
        """No more readings: measure what is covered, count the tail up to the newest reading as
        idle, and hold no more rows. Returns the idle uJ added."""
        idle = self.attribute()
        idle += self._idle_until(self.readings.covered_ns(ENERGY_FIELD))
        self.closed = True
        return idle
