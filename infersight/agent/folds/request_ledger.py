"""RequestLedger: request events held until each request finishes, then one row per request.

A request's events arrive over many polls; they wait in `open_events` (bounded) until its
FINISHED event, its NETWORK record (served requests, agent.folds.network_hold) and its steps' energy
(agent.folds.energy_account) are all in. Then correlate.requests builds its row, which gets its engine
time, energy, kernel time and slow cause, is observed into the latency histograms and counters
per task, and is kept (`finished`, bounded) and handed on (`new_rows`, the emit callback).
"""
from __future__ import annotations

import sys
import time
from typing import Callable

import numpy as np
import pandas as pd

from infersight.agent.rings.engine_scope import EngineScope
from infersight.agent.folds.energy_account import EnergyAccount
from infersight.agent.rows.finished_rows import FinishedRows
from infersight.agent.folds.kv import KvFold
from infersight.agent.folds.network_hold import MAX_OPEN_REQUESTS, NetworkHold
from infersight.agent.slow.judge import SlowJudge
from infersight.agent.folds.spec import SpecFold
from infersight.agent.folds.host_pause import HostPauseFold
from infersight.agent.folds.step import StepFold
from infersight.correlate import requests
from infersight.correlate.frames import EventFrames, concat_frames
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter, LabelledHistogram


class RequestLedger:
    def __init__(self, counters: dict[str, LabelledCounter], histograms: dict[str, LabelledHistogram],
                 retention_bytes: int, steps: StepFold, energy: EnergyAccount, network: NetworkHold, kv: KvFold,
                 spec: SpecFold, judge: SlowJudge, host_pauses: HostPauseFold,
                 kernel_seconds: Callable[[np.ndarray], list[float]],
                 emit: Callable[[pd.DataFrame, pd.DataFrame], None], scope: EngineScope | None = None) -> None:
        """scope: the engine label's (agent.rings.engine_scope; None: off), to count released rows by engine."""
        self.counters, self.histograms = counters, histograms
        self.scope = scope if scope is not None else EngineScope(False)
        self.steps, self.energy, self.network, self.kv, self.spec, self.judge = steps, energy, network, kv, spec, judge
        self.host_pauses = host_pauses
        self.kernel_seconds, self.emit = kernel_seconds, emit
        self.finished = FinishedRows(sys.maxsize, retention_bytes)  # bounded by bytes (AgentConfig.retention.rows_bytes)
        self.new_rows: list[pd.DataFrame] = []  # rows not yet handed to the Parquet sink
        self.open_events = EventFrames().request_events
        self.requests_seen = 0

    def oldest_open_ns(self) -> int | None:
        """When the oldest event of a request in flight happened (None: no request in flight)."""
        return int(self.open_events["ts_ns"].min()) if not self.open_events.empty else None

    def fold(self, events: pd.DataFrame, network_wait_s: float) -> None:
        """Add one batch of request events; build the rows of the requests that are complete now."""
        self.requests_seen += int((events["event"] == "ARRIVED").sum())
        for reason in events.loc[events["event"] == "PREEMPTED", "reason"]:
            self.counters[C.PREEMPTIONS.name].inc((reason,))
        self.open_events = concat_frames([self.open_events, events]) if not self.open_events.empty else events
        open_ids = self.open_events["request_id"].unique()
        if len(open_ids) > MAX_OPEN_REQUESTS:
            # A request whose FINISHED event was dropped would stay open forever: keep the newest.
            stale = open_ids[:len(open_ids) - MAX_OPEN_REQUESTS]
            self.open_events = self.open_events[~self.open_events["request_id"].isin(stale)].reset_index(drop=True)
            for rid in stale:
                self.steps.engine_seconds.pop(int(rid), None)
            self.energy.forget(stale.tolist())
        done_ids = self.open_events.loc[self.open_events["event"] == "FINISHED", "request_id"].unique()
        done_ids = self.network.release(done_ids, network_wait_s)
        done_ids = self.energy.complete(done_ids, self.open_events)
        if len(done_ids) == 0:
            return
        for engine, ids in self.scope.split(done_ids):  # one group, the ids as they are, with the label off
            with self.scope.within(engine):  # each row counted under its own engine (agent.rings.engine_scope)
                self._release(ids)

    def _release(self, done_ids: np.ndarray) -> None:
        """Build, count and keep the rows of the finished requests done_ids."""
        done_mask = self.open_events["request_id"].isin(done_ids)
        done, self.open_events = self.open_events[done_mask], self.open_events[~done_mask].reset_index(drop=True)
        # A request whose ARRIVED we never saw (it began before this agent attached, or the record
        # was dropped) cannot be decomposed and gets no row: count it, never lose it silently.
        arrived = done.loc[done["event"] == "ARRIVED", "request_id"].unique()
        orphaned = len(done_ids) - len(np.intersect1d(done_ids, arrived))
        self.counters[C.REQUESTS_ORPHANED.name].inc((), orphaned)
        rows = requests.request_table(done, self.network.take_rows(done_ids, done))
        ids = rows["request_id"].to_numpy(np.int64)
        id_list, engine_seconds = ids.tolist(), self.steps.engine_seconds
        rows["engine_seconds"] = [engine_seconds.pop(r, 0.0) for r in id_list]
        for column, values in self.energy.take(ids).items():
            rows[column] = values
        rows["gpu_kernel_s"] = self.kernel_seconds(ids)
        # Only these requests' verifications, picked frame by frame (the window is not joined per poll).
        spec = self.spec.window.rows_of("request_id", ids)
        attribution = self.steps.attribution
        slow = self.judge.judge(rows, done, attribution.steps, attribution.batch, spec, self.kv.reload_events,
                                self.host_pauses.window)
        self.kv.forget_reloads(done_ids)
        causes = dict(zip(slow["request_id"], slow["slow_cause"]))
        details = dict(zip(slow["request_id"], slow["detail"]))
        rows["slow_cause"] = [causes.get(r, "") for r in id_list]
        rows["slow_detail"] = [details.get(r, "") for r in id_list]
        for cause in causes.values():
            self.counters[C.SLOW.name].inc((cause,))
        self._observe_rows(rows, done)
        # Kept as frames: turned into dicts only when read (FinishedRows) or handed to the sink.
        self.finished.extend_frame(rows)
        self.new_rows.append(rows.copy(deep=False))
        self.emit(rows, done)

    def _observe_rows(self, rows: pd.DataFrame, events: pd.DataFrame) -> None:
        # Per task (sorted, as groupby would), over the columns' arrays: no sub-frame per task.
        codes, names = pd.factorize(rows["task"], sort=True)
        col = {c: rows[c].to_numpy() for c in ("ttft_s", "e2e_s", "prompt_tokens", "output_tokens", "engine_seconds",
                                                "energy_j", "trace_id", "finish_reason", *(f"{p}_s" for p in C.PHASES))}
        for code, task in enumerate(names.tolist()):
            at = np.flatnonzero(codes == code)
            t = (str(task),)
            trace = col["trace_id"][at]
            wall = time.time()
            ttft = col["ttft_s"][at]
            has_ttft = ~np.isnan(ttft)
            self.histograms[C.TTFT.name].observe(t, ttft[has_ttft], trace[has_ttft].tolist(), wall)
            self.histograms[C.E2E.name].observe(t, col["e2e_s"][at], trace.tolist(), wall)
            for phase in C.PHASES:
                self.histograms[C.PHASE.name].observe((phase, str(task)), col[f"{phase}_s"][at])
            self.counters[C.PROMPT_TOKENS.name].inc(t, int(col["prompt_tokens"][at].sum()))
            self.counters[C.GENERATION_TOKENS.name].inc(t, int(col["output_tokens"][at].sum()))
            # float sums through pandas, as before (its NaN-skipping sum, to the last bit)
            self.counters[C.ENGINE_SECONDS.name].inc(t, float(pd.Series(col["engine_seconds"][at]).sum()))
            energy = pd.Series(col["energy_j"][at])
            if energy.notna().any():  # no series at all where no GPU measured energy
                self.counters[C.ENERGY.name].inc(t, float(energy.sum()))
            for reason, n in _value_counts(col["finish_reason"][at].tolist()):
                self.counters[C.REQUESTS.name].inc((str(task), str(reason)), int(n))
        # One row per token: arrays and task codes, no frame and no groupby per task (tasks by name).
        _, tasks, names, itl_s = requests.inter_token_latency_arrays(events)
        present = np.flatnonzero(np.bincount(tasks + 1)) - 1 if len(tasks) else tasks  # np.unique's, without a sort
        for code, task in sorted(((c, names[c]) for c in present.tolist()), key=lambda ct: ct[1]):
            self.histograms[C.ITL.name].observe((str(task),), itl_s[tasks == code])


def _value_counts(values: list[object]) -> list[tuple[object, int]]:
    """pd.Series(values).value_counts().items() for a few distinct values: most frequent first, ties
    in order of first appearance, missing values left out; a dict count, not a Series per task."""
    counts: dict[object, int] = {}
    for v in values:
        if v is not None and v == v:  # value_counts drops None and NaN
            counts[v] = counts.get(v, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])
