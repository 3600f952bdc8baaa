"""StepFold: step records and batch rows folded into step counters, per-request engine time and
the windows other analyses read.

Cost (each request's token share of a step's time) needs a step with all its batch rows, and a
ring read can split them, so incomplete steps wait in `pending` (bounded). The attribution window
keeps the steps and batch rows since the oldest request in flight, for the slow-request analysis.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd

from infersight.agent.folds.energy_account import EnergyAccount
from infersight.correlate import cost
from infersight.correlate.frames import EventFrames
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter, LabelledHistogram

#: Steps waiting for batch rows that ring drops may have lost, at most.
MAX_PENDING_STEPS = 256
#: Steps (with their batch rows) kept for the slow-request attribution: those since the oldest request
#: in flight, at most this many (a request older than that loses its batch-interference figure).
MAX_ATTRIBUTION_STEPS = 20_000
#: Batch rows kept in recent_batch (for joining captures to requests), whatever the batch count.
RECENT_BATCH_ROWS = 262_144


class StepFold:
    def __init__(self, counters: dict[str, LabelledCounter], histograms: dict[str, LabelledHistogram],
                 energy: EnergyAccount) -> None:
        self.counters, self.histograms, self.energy = counters, histograms, energy
        self.last_step: dict[str, int] = {}
        self.recent_steps: deque[pd.DataFrame] = deque(maxlen=64)  # recent step batches, for GPU phases
        self.recent_batch: deque[pd.DataFrame] = deque(maxlen=256)  # for joining captures to requests
        self.attribution = EventFrames()  # steps and batch rows since the oldest request in flight
        self.pending = EventFrames()  # steps whose batch rows have not all arrived, and those rows
        self.engine_seconds: dict[int, float] = {}  # request in flight -> its share of step time so far

    def fold(self, frames: EventFrames) -> None:
        """Fold one batch's steps and batch rows."""
        steps = frames.steps
        if not frames.batch.empty:
            self.recent_batch.append(frames.batch)
            # Bounded in rows too (~32 B each): one poll over a long backlog can hold 10^5 of them.
            while len(self.recent_batch) > 1 and sum(len(f) for f in self.recent_batch) > RECENT_BATCH_ROWS:
                self.recent_batch.popleft()
        self.attribution = self.attribution.concat(EventFrames(steps=steps, batch=frames.batch))
        if not steps.empty:
            self.recent_steps.append(steps)
            last = steps.iloc[-1]
            self.last_step = {k: int(last[k]) for k in steps.columns}
            self.counters[C.STEPS.name].inc((), len(steps))
            self.histograms[C.STEP_DURATION.name].observe((), (steps["end_ns"] - steps["start_ns"]) / 1e9)
            tokens = self.counters[C.STEP_TOKENS.name]
            for kind, col in (("prefill", "prefill_tokens"), ("decode", "decode_tokens"), ("spec", "spec_tokens")):
                tokens.inc((kind,), int(steps[col].sum()))
        # Before any step of this poll: the chunk events that tell a step's prefilling members apart.
        self.energy.add_prefill_chunks(frames.request_events)
        # Cost needs each step with all its batch rows; a read can split them, so hold the rest.
        pend = self.pending.concat(EventFrames(steps=steps, batch=frames.batch))
        # Batch rows per step id, by numpy (a pandas groupby + reindex costs ms on every poll).
        batch_step = pend.batch["step_id"].to_numpy(np.int64)
        step_ids = pend.steps["step_id"].to_numpy(np.int64)
        have_ids, have_n = np.unique(batch_step, return_counts=True)
        at = np.minimum(np.searchsorted(have_ids, step_ids), max(len(have_ids) - 1, 0))
        have = np.where(have_ids[at] == step_ids, have_n[at], 0) if len(have_ids) else np.zeros(len(step_ids), np.int64)
        complete = pend.steps["batch_size"].to_numpy() == have
        ready_steps = pend.steps[complete]
        ready_batch = pend.batch[np.isin(batch_step, step_ids[complete])]
        waiting = pend.steps[~complete]
        if len(waiting) > MAX_PENDING_STEPS:
            # Batch rows lost to ring drops never arrive; forget the oldest incomplete steps
            # (their cost is not attributed; the drops themselves are counted by the ring).
            waiting = waiting.iloc[-MAX_PENDING_STEPS:]
        self.pending = EventFrames(steps=waiting.reset_index(drop=True),
                                   batch=pend.batch[np.isin(batch_step, waiting["step_id"].to_numpy(np.int64))]
                                   .reset_index(drop=True))
        if not ready_steps.empty:
            shares = cost.step_cost_shares(ready_steps, ready_batch)
            per_request = cost.cost_by_request(shares)
            totals = self.engine_seconds
            for rid, secs in zip(per_request["request_id"].tolist(), per_request["engine_seconds"].tolist()):
                totals[rid] = totals.get(rid, 0.0) + secs
            self.energy.add_steps(ready_steps, ready_batch)

    def trim_attribution(self, oldest_open_ns: int | None) -> None:
        """Keep the steps (and batch rows) a request in flight may need: since the oldest one arrived
        (oldest_open_ns; None: no request in flight), at most MAX_ATTRIBUTION_STEPS."""
        steps, batch = self.attribution.steps, self.attribution.batch
        if steps.empty and batch.empty:
            return
        oldest = oldest_open_ns
        if oldest is not None and len(steps) <= MAX_ATTRIBUTION_STEPS and (
                steps.empty or int(steps["end_ns"].min()) >= oldest):
            return  # every step is still needed (and so are their batch rows)
        keep = steps.iloc[0:0] if oldest is None else steps[steps["end_ns"] >= oldest].iloc[-MAX_ATTRIBUTION_STEPS:]
        # Batch rows may come before their step record: keep those of steps not seen yet, too.
        newest = int(steps["step_id"].max()) if not steps.empty else -1
        self.attribution = EventFrames(steps=keep.reset_index(drop=True), batch=batch[
            batch["step_id"].isin(keep["step_id"]) | (batch["step_id"] > newest)].reset_index(drop=True))
