"""AgentState: everything the agent knows, updated one batch of events at a time.

Per batch the analyses in `correlate` run on the new frames (plus what is carried over: events
of requests still in flight, steps still waiting for their batch rows). The results are folded
into cumulative counters and histograms that the exporters render. A lock guards the state
between the ingest thread and the HTTP handlers; the engine never takes it.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from typing import Callable

import numpy as np
import pandas as pd

from infersight.agent.config import AgentConfig
from infersight.agent.energy_meter import EnergyMeter
from infersight.agent.row_window import RowWindow
from infersight.correlate import cost, kv, requests, slow_causes, slow_rule, speculation
from infersight.correlate.frames import EventFrames
from infersight.exporters.aggregates import LabelledCounter, LabelledHistogram
from infersight.exporters import catalogue as C
from infersight.gpu.samples import GpuSample

#: Verifications kept for per-task acceptance and speedup (recent behaviour is what advice needs).
SPEC_WINDOW = 100_000
#: Timed steps kept for the measured speedup (those that drafted or were plain probes; steps of
#: engines without a draft are not kept).
SPEC_STEP_WINDOW = 50_000
#: Expert-parallel records kept (layers x ranks x steps) for the all-to-all share and the replication plan.
EP_WINDOW = 50_000
#: Bounds on state waiting for events that ring drops may have lost.
MAX_PENDING_STEPS = 256
MAX_OPEN_REQUESTS = 50_000
#: Steps (with their batch rows) kept for the slow-request attribution: those since the oldest request
#: in flight, at most this many (a request older than that loses its batch-interference figure).
MAX_ATTRIBUTION_STEPS = 20_000
#: Batch rows kept in recent_batch (for joining captures to requests), whatever the batch count.
RECENT_BATCH_ROWS = 262_144
#: How long a served request's row waits for its NETWORK record before it is computed without one.
NETWORK_WAIT_S = 10.0


class AgentState:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.started_wall = time.time()
        self.counters = {spec.name: LabelledCounter() for spec in C.CATALOGUE if spec.kind == "counter"}
        self.histograms = {spec.name: LabelledHistogram(spec.buckets or ()) for spec in C.CATALOGUE
                           if spec.kind == "histogram"}
        self.last_step: dict[str, int] = {}
        self.finished: deque[dict[str, object]] = deque(maxlen=config.retain_requests)
        self.slow_rule = slow_rule.SlowRule(config.slow_quantile, config.slow_window, config.min_requests_for_p99,
                                            config.slo_ttft_s, config.slo_itl_s, config.slo_e2e_s)
        self.slow_window = pd.DataFrame()  # slow_features of the last slow_window finished requests
        self.attribution = EventFrames()  # steps and batch rows since the oldest request in flight
        self.new_rows: list[dict[str, object]] = []  # rows not yet handed to the Parquet sink
        self.open_events = EventFrames().request_events
        self.open_engine_seconds: dict[int, float] = {}
        # GPU energy over the steps, split by token share; rows wait for it (at most a few sampler intervals).
        self.energy = EnergyMeter(tuple(config.energy_gpus), wait_s=max(5.0, 4 * config.gpu_interval_s))
        self._no_request_events = EventFrames().request_events  # releases held rows without new events
        self.pending = EventFrames()  # steps whose batch rows have not all arrived, and those rows
        self.kv_carry = EventFrames().kv_events
        self.reload_events = EventFrames().kv_events  # KV reloads of requests still in flight
        self.expert_tokens = np.zeros((0, 0), dtype=np.int64)
        self.prefix_groups: dict[int, list[int]] = {}  # group hash -> [requests, cached tokens, prompt tokens]
        self.ep_events = EventFrames().ep  # expert-parallel records of recent steps, all ranks
        self.spec_window = RowWindow(EventFrames().spec, SPEC_WINDOW)  # recent verifications (spec_events)
        self.spec_step_timing = EventFrames().step_timing  # recent speculative and plain-probe steps
        self.ring_stats: dict[str, dict[str, int]] = {}
        self.source_stats: dict[str, dict[str, object]] = {}  # non-ring sources (e.g. vLLM KV events): their health
        self.wall_anchor: tuple[int, int] = (time.time_ns(), time.monotonic_ns())
        self.requests_seen = 0
        self.counters[C.REQUESTS_ORPHANED.name].inc((), 0)  # a 0 sample from the start, not a missing series
        self.recent_steps: deque[pd.DataFrame] = deque(maxlen=64)  # recent step batches, for GPU phases
        self.recent_batch: deque[pd.DataFrame] = deque(maxlen=256)  # for joining captures to requests
        self.kernel_by_request: OrderedDict[int, dict[str, object]] = OrderedDict()  # from captures
        self.recorder_summary: dict[str, object] | None = None  # the flight recorder's block (agent.flight_recorder)
        self.gpu_status = "GPU telemetry: not started"
        self.gpu_phases: list[dict[str, object]] = []
        # -- requests served over HTTP (`infersight serve`): their NETWORK record follows FINISHED -----
        self.awaiting_network: dict[int, float] = {}  # served request id -> when its row was first held (0: not yet)
        self.network: dict[int, tuple[int, int]] = {}  # request id -> (receive_ns, last_byte_ns)
        #: Called under the lock with each batch of finished rows and their request events (tracing).
        self.on_rows: Callable[[pd.DataFrame, pd.DataFrame], None] | None = None

    # -- ingest -------------------------------------------------------------------------------------
    def ingest(self, frames: EventFrames) -> None:
        with self.lock:
            self._steps(frames)
            self._kv(frames.kv_events)
            self._moe(frames.moe)
            self._prefix(frames.prefix)
            self._spec(frames.spec)
            self._spec_steps(frames.step_timing)
            self._ep(frames.ep)
            self._network(frames)
            self._requests(frames.request_events)
            self._trim_attribution()

    def count_rejected(self, rejected: dict[tuple[str, str], int]) -> None:
        """Probe records the agent refused since the last call, {(ring, reason): n} (agent.record_limits)."""
        if rejected:
            with self.lock:
                for labels, n in rejected.items():
                    self.counters[C.PROBE_REJECTED.name].inc(labels, n)

    def set_ring_stats(self, stats: dict[str, dict[str, int]], anchor: tuple[int, int] | None) -> None:
        with self.lock:
            self.ring_stats = stats
            if anchor is not None:
                self.wall_anchor = anchor

    def _wall_s(self, mono_ns: int) -> float:
        wall, mono = self.wall_anchor
        return (wall + (mono_ns - mono)) / 1e9

    def _steps(self, frames: EventFrames) -> None:
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
        # Cost needs each step with all its batch rows; a read can split them, so hold the rest.
        pend = self.pending.concat(EventFrames(steps=steps, batch=frames.batch))
        have = pend.batch.groupby("step_id").size()
        complete = pend.steps["batch_size"].to_numpy() == have.reindex(pend.steps["step_id"]).fillna(0).to_numpy()
        ready_steps = pend.steps[complete]
        ready_batch = pend.batch[pend.batch["step_id"].isin(ready_steps["step_id"])]
        waiting = pend.steps[~complete]
        if len(waiting) > MAX_PENDING_STEPS:
            # Batch rows lost to ring drops never arrive; forget the oldest incomplete steps
            # (their cost is not attributed; the drops themselves are counted by the ring).
            waiting = waiting.iloc[-MAX_PENDING_STEPS:]
        self.pending = EventFrames(steps=waiting.reset_index(drop=True),
                                   batch=pend.batch[pend.batch["step_id"].isin(waiting["step_id"])]
                                   .reset_index(drop=True))
        if not ready_steps.empty:
            shares = cost.step_cost_shares(ready_steps, ready_batch)
            per_request = cost.cost_by_request(shares)
            for rid, secs in zip(per_request["request_id"], per_request["engine_seconds"]):
                self.open_engine_seconds[int(rid)] = self.open_engine_seconds.get(int(rid), 0.0) + float(secs)
            self.energy.add_steps(ready_steps, ready_batch)
            self._count_idle(self.energy.attribute())

    def _kv(self, events: pd.DataFrame) -> None:
        if events.empty:
            return
        counter = self.counters[C.KV_EVENTS.name]
        for event, n in kv.transition_counts(events).items():
            if n:
                counter.inc((event,), n)
        recomputed = kv.recomputed_blocks(events)
        if recomputed:
            self.counters[C.KV_RECOMPUTED_TOKENS.name].inc((), recomputed * self.last_step.get("kv_block_size", 16))
        reloads = events[events["event"] == "reloaded"]
        if not reloads.empty:
            self.reload_events = pd.concat([self.reload_events, reloads], ignore_index=True)
        # Ages that end in this batch may have started in an earlier one: carry each block's open
        # events (its last birth and last "cached" since its last close) and measure over carry + new.
        window = pd.concat([self.kv_carry, events], ignore_index=True) if not self.kv_carry.empty else events
        hist = self.histograms[C.KV_AGE.name]
        for age_kind, group in kv.block_lifetimes(window).groupby("kind"):
            hist.observe((str(age_kind),), group["seconds"].to_numpy())
        last_close = window[window["event"].isin(["evicted", "freed"])].groupby("block_id")["ts_ns"].max()
        after = window[window["ts_ns"] > window["block_id"].map(last_close).fillna(-1)]
        opens = after[after["event"].isin(["allocated", "reloaded", "cached"])]
        self.kv_carry = opens.groupby(["block_id", "event"], sort=False).tail(1).reset_index(drop=True)

    def _moe(self, frame: pd.DataFrame) -> None:
        if frame.empty:
            return
        # Straight from the rows (int64 adds): moe.expert_load's groupby would only pre-sum them.
        layer, expert = frame["layer"].to_numpy(np.int64), frame["expert"].to_numpy(np.int64)
        n_layers, n_experts = int(layer.max()) + 1, int(expert.max()) + 1
        if self.expert_tokens.shape[0] < n_layers or self.expert_tokens.shape[1] < n_experts:
            grown = np.zeros((max(n_layers, self.expert_tokens.shape[0]), max(n_experts, self.expert_tokens.shape[1])),
                             dtype=np.int64)
            grown[:self.expert_tokens.shape[0], :self.expert_tokens.shape[1]] = self.expert_tokens
            self.expert_tokens = grown
        np.add.at(self.expert_tokens, (layer, expert), frame["tokens"].to_numpy(np.int64))

    def _prefix(self, frame: pd.DataFrame) -> None:
        if frame.empty:
            return
        # Per task and per group, not per row: bincounts over factorized codes (first-seen order).
        tasks, task_names = pd.factorize(frame["task"])
        prompt = frame["prompt_tokens"].to_numpy(np.int64)
        cached = frame["cached_tokens"].to_numpy(np.int64)
        k = len(task_names)
        sums = zip(task_names.tolist(), np.bincount(tasks, minlength=k).tolist(),
                   np.bincount(tasks, prompt, minlength=k).tolist(), np.bincount(tasks, cached, minlength=k).tolist(),
                   np.bincount(tasks, cached > 0, minlength=k).tolist())
        for task, n, prompt_sum, cached_sum, hits in sums:
            self.counters[C.PREFIX_QUERIED.name].inc((task,), prompt_sum)
            self.counters[C.PREFIX_HIT.name].inc((task,), cached_sum)
            self.counters[C.PREFIX_REQUESTS.name].inc((task,), n)
            if hits:
                self.counters[C.PREFIX_HIT_REQUESTS.name].inc((task,), hits)
        group_hash = frame["group_hash"].to_numpy(np.uint64)
        grouped = group_hash != 0
        groups, hashes = pd.factorize(group_hash[grouped])
        for gh, n, cached_sum, prompt_sum in zip(hashes.tolist(), np.bincount(groups).tolist(),
                                                 np.bincount(groups, cached[grouped]).tolist(),
                                                 np.bincount(groups, prompt[grouped]).tolist()):
            g = self.prefix_groups.setdefault(int(gh), [0, 0, 0])
            g[0] += int(n)
            g[1] += int(cached_sum)
            g[2] += int(prompt_sum)
        if len(self.prefix_groups) > 4 * self.config.retain_requests:  # bounded: keep the biggest groups
            keep = sorted(self.prefix_groups.items(), key=lambda kv_: -kv_[1][0])[: self.config.retain_requests]
            self.prefix_groups = dict(keep)

    def _spec(self, frame: pd.DataFrame) -> None:
        if frame.empty:
            return
        self.spec_window.append(frame)  # recent verifications only
        tasks, names = pd.factorize(frame["task"], sort=True)  # bincounts: pandas' groupby costs ms per call
        k = len(names)
        for task, proposed, accepted, n in zip(
                names.tolist(), np.bincount(tasks, frame["proposed"].to_numpy(np.int64), minlength=k).tolist(),
                np.bincount(tasks, frame["accepted"].to_numpy(np.int64), minlength=k).tolist(),
                np.bincount(tasks, minlength=k).tolist()):
            self.counters[C.SPEC_DRAFT.name].inc((task,), int(proposed))
            self.counters[C.SPEC_ACCEPTED.name].inc((task,), int(accepted))
            self.counters[C.SPEC_VERIFICATIONS.name].inc((task,), n)
        by_pos = speculation.acceptance_by_position(frame)
        for row in by_pos.itertuples(index=False):
            self.counters[C.SPEC_POSITION_PROPOSED.name].inc((row.task, str(row.position)), row.proposed)
            self.counters[C.SPEC_POSITION_ACCEPTED.name].inc((row.task, str(row.position)), row.accepted)

    @property
    def spec_events(self) -> pd.DataFrame:
        """The last SPEC_WINDOW verifications, one frame (the same object until the next poll adds some)."""
        return self.spec_window.frame()

    def _spec_steps(self, frame: pd.DataFrame) -> None:
        """Step timings that the measured speedup needs (correlate.spec_speedup), in a window."""
        frame = frame[frame["spec_probe"] | (frame["spec_tokens"] > 0)]
        if frame.empty:
            return
        old = self.spec_step_timing
        both = pd.concat([old, frame], ignore_index=True) if not old.empty else frame
        self.spec_step_timing = both.iloc[-SPEC_STEP_WINDOW:].reset_index(drop=True)

    def _ep(self, frame: pd.DataFrame) -> None:
        """Expert-parallel stats from every rank's ring, kept for a recent window of steps."""
        if frame.empty:
            return
        ep = pd.concat([self.ep_events, frame], ignore_index=True) if not self.ep_events.empty else frame
        self.ep_events = ep.iloc[-EP_WINDOW:].reset_index(drop=True)

    def _requests(self, events: pd.DataFrame) -> None:
        self.requests_seen += int((events["event"] == "ARRIVED").sum())
        for reason in events.loc[events["event"] == "PREEMPTED", "reason"]:
            self.counters[C.PREEMPTIONS.name].inc((reason,))
        self.open_events = pd.concat([self.open_events, events], ignore_index=True) if not self.open_events.empty else events
        open_ids = self.open_events["request_id"].unique()
        if len(open_ids) > MAX_OPEN_REQUESTS:
            # A request whose FINISHED event was dropped would stay open forever: keep the newest.
            stale = open_ids[:len(open_ids) - MAX_OPEN_REQUESTS]
            self.open_events = self.open_events[~self.open_events["request_id"].isin(stale)].reset_index(drop=True)
            for rid in stale:
                self.open_engine_seconds.pop(int(rid), None)
            self.energy.forget(stale.tolist())
        done_ids = self.open_events.loc[self.open_events["event"] == "FINISHED", "request_id"].unique()
        done_ids = self._release_held(done_ids)
        done_ids = self._energy_complete(done_ids)
        if len(done_ids) == 0:
            return
        done_mask = self.open_events["request_id"].isin(done_ids)
        done, self.open_events = self.open_events[done_mask], self.open_events[~done_mask].reset_index(drop=True)
        # A request whose ARRIVED we never saw (it began before this agent attached, or the record
        # was dropped) cannot be decomposed and gets no row: count it, never lose it silently.
        arrived = done.loc[done["event"] == "ARRIVED", "request_id"].unique()
        orphaned = len(done_ids) - len(np.intersect1d(done_ids, arrived))
        self.counters[C.REQUESTS_ORPHANED.name].inc((), orphaned)
        rows = requests.request_table(done, self._network_rows(done_ids, done))
        rows["engine_seconds"] = [self.open_engine_seconds.pop(int(r), 0.0) for r in rows["request_id"]]
        measured = [self.energy.take(int(r)) for r in rows["request_id"]]
        rows["energy_j"] = [m[0] for m in measured]
        rows["gpu_sm_active_s"] = [m[1] for m in measured]
        rows["gpu_kernel_s"] = [self.kernel_seconds(int(r)) for r in rows["request_id"]]
        slow = self._judge_slow(rows, done)
        if not self.reload_events.empty:
            self.reload_events = self.reload_events[~self.reload_events["request_id"].isin(done_ids)]
        causes = dict(zip(slow["request_id"], slow["slow_cause"]))
        details = dict(zip(slow["request_id"], slow["detail"]))
        rows["slow_cause"] = [causes.get(r, "") for r in rows["request_id"]]
        rows["slow_detail"] = [details.get(r, "") for r in rows["request_id"]]
        for cause in causes.values():
            self.counters[C.SLOW.name].inc((cause,))
        self._observe_rows(rows, done)
        columns = list(rows.columns)  # as to_dict("records") (Python values), a third of its cost
        records = [dict(zip(columns, values)) for values in zip(*(rows[c].tolist() for c in columns))]
        self.finished.extend(records)
        self.new_rows.extend(records)
        if self.on_rows is not None:
            self.on_rows(rows, done)

    def _judge_slow(self, rows: pd.DataFrame, done: pd.DataFrame) -> pd.DataFrame:
        """attribute_slow's verdicts on the requests of `rows` that slow_rule flags, against the window
        of recent finished requests (across polls); then forgets the steps no request in flight needs."""
        # Only these requests' verifications, picked frame by frame (the window is not joined per poll).
        spec = self.spec_window.rows_of("request_id", rows["request_id"].to_numpy())
        features = slow_causes.slow_features(rows, done, self.attribution.steps, self.attribution.batch,
                                             spec, self.reload_events)
        verdicts, self.slow_window = slow_rule.judge_slow(features.sort_values("finish_ns", kind="stable"),
                                                          self.slow_window, self.slow_rule)
        flagged = features.merge(verdicts.loc[verdicts["slow"], ["request_id", "metric", "threshold_s"]],
                                 on="request_id")
        return slow_causes.attribute_slow(flagged, self.slow_window)

    def _trim_attribution(self) -> None:
        """Keep the steps (and batch rows) a request in flight may need: since the oldest one arrived,
        at most MAX_ATTRIBUTION_STEPS."""
        steps, batch = self.attribution.steps, self.attribution.batch
        if steps.empty and batch.empty:
            return
        oldest = int(self.open_events["ts_ns"].min()) if not self.open_events.empty else None
        if oldest is not None and len(steps) <= MAX_ATTRIBUTION_STEPS and (
                steps.empty or int(steps["end_ns"].min()) >= oldest):
            return  # every step is still needed (and so are their batch rows)
        keep = steps.iloc[0:0] if oldest is None else steps[steps["end_ns"] >= oldest].iloc[-MAX_ATTRIBUTION_STEPS:]
        # Batch rows may come before their step record: keep those of steps not seen yet, too.
        newest = int(steps["step_id"].max()) if not steps.empty else -1
        self.attribution = EventFrames(steps=keep.reset_index(drop=True), batch=batch[
            batch["step_id"].isin(keep["step_id"]) | (batch["step_id"] > newest)].reset_index(drop=True))

    # -- GPU energy ------------------------------------------------------------------------------------
    def add_gpu_samples(self, samples: list[GpuSample]) -> None:
        """The sampler's readings (those not seen before count): measure the steps they now cover, and
        build the rows that were waiting for that."""
        with self.lock:
            self.energy.add_samples(samples)
            self._count_idle(self.energy.attribute())
            if self.energy.holding:
                self._requests(self._no_request_events)

    def close_energy(self) -> None:
        """No more readings will come (the sampler stopped): the tail of the account is idle, and no
        row waits any longer."""
        with self.lock:
            self._count_idle(self.energy.close())
            self._requests(self._no_request_events)

    def _count_idle(self, idle_uj: int) -> None:
        if idle_uj:
            self.counters[C.ENERGY_IDLE.name].inc((), idle_uj / 1e6)

    def _energy_complete(self, done_ids: np.ndarray) -> np.ndarray:
        """The finished requests whose steps' energy has been measured (all of them without a GPU
        energy counter); the rest wait in open_events (EnergyMeter.ready)."""
        if len(done_ids) == 0 or not self.energy.active:
            return done_ids
        fin = self.open_events[self.open_events["event"] == "FINISHED"].groupby("request_id")["ts_ns"].max()
        ids = [int(r) for r in done_ids]
        ready = self.energy.ready(ids, [int(fin.get(r, -1)) for r in ids])
        return np.asarray(ready, dtype=np.int64)

    def kernel_seconds(self, request_id: int) -> float:
        """The request's share of GPU kernel time in profiler captures (NaN: no capture covered it)."""
        summary = self.kernel_by_request.get(request_id)
        return float(summary["kernel_ns"]) / 1e9 if summary else float("nan")  # type: ignore[arg-type]

    # -- network timing of served requests ------------------------------------------------------------
    def _network(self, frames: EventFrames) -> None:
        """Note served requests (SERVED, written at arrival) and their timing (NETWORK, after the last
        byte). Both tables are bounded: records of requests that never finish are forgotten oldest first."""
        for rid in frames.served["request_id"].tolist():
            self.awaiting_network.setdefault(int(rid), 0.0)
        for rid, recv, last in frames.network[["request_id", "receive_ns", "last_byte_ns"]].itertuples(index=False):
            self.network[int(rid)] = (int(recv), int(last))
        for table in (self.awaiting_network, self.network):
            while len(table) > MAX_OPEN_REQUESTS:
                del table[next(iter(table))]

    def _release_held(self, done_ids: np.ndarray) -> np.ndarray:
        """The finished requests whose row can be computed now. A served request's last byte goes out
        after its FINISHED event, so its row waits (in open_events) for the NETWORK record; if that
        never comes (lost to ring drops, a server crash) it goes without after NETWORK_WAIT_S."""
        if not self.awaiting_network:
            return done_ids
        now, ready = time.monotonic(), []
        for rid in done_ids.tolist():
            since = self.awaiting_network.get(rid)
            if since is not None and rid not in self.network:
                if since == 0.0:
                    self.awaiting_network[rid] = since = now
                if now - since < NETWORK_WAIT_S:
                    continue
            ready.append(rid)
        return np.asarray(ready, dtype=np.int64)

    def _network_rows(self, done_ids: np.ndarray, done: pd.DataFrame) -> pd.DataFrame:
        """request_table's network frame for done_ids (receive and last byte; the last byte ends e2e),
        taking their entries out of the tables. A client that hung up mid-response had its last byte
        before the engine aborted the request: the response then ends at the abort (network >= 0)."""
        rows = []
        finished = None  # FINISHED times, only once some request has network timing (most have none)
        for rid in done_ids.tolist() if self.awaiting_network or self.network else ():
            self.awaiting_network.pop(rid, None)
            timing = self.network.pop(rid, None)
            if timing is not None:
                if finished is None:
                    finished = done[done["event"] == "FINISHED"].groupby("request_id")["ts_ns"].min()
                rows.append((rid, timing[0], max(timing[1], int(finished.get(rid, timing[1])))))
        return pd.DataFrame(rows, columns=["request_id", "receive_ns", "send_end_ns"]).astype("int64")

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
            for reason, n in pd.Series(col["finish_reason"][at]).value_counts().items():
                self.counters[C.REQUESTS.name].inc((str(task), str(reason)), int(n))
        # One row per token: arrays and task codes, no frame and no groupby per task (tasks by name).
        _, tasks, names, itl_s = requests.inter_token_latency_arrays(events)
        for code, task in sorted(((c, names[c]) for c in np.unique(tasks).tolist()), key=lambda ct: ct[1]):
            self.histograms[C.ITL.name].observe((str(task),), itl_s[tasks == code])

    def recent_steps_frame(self) -> pd.DataFrame:
        with self.lock:
            frames = list(self.recent_steps)
        return pd.concat(frames, ignore_index=True) if frames else EventFrames().steps

    def recent_batch_frame(self) -> pd.DataFrame:
        with self.lock:
            frames = list(self.recent_batch)
        return pd.concat(frames, ignore_index=True) if frames else EventFrames().batch

    def add_kernel_summaries(self, summaries: dict[int, dict[str, object]]) -> None:
        with self.lock:
            self.kernel_by_request.update(summaries)
            while len(self.kernel_by_request) > self.config.retain_requests:
                self.kernel_by_request.popitem(last=False)

    def set_gpu_summary(self, status: str, phases: list[dict[str, object]]) -> None:
        with self.lock:
            self.gpu_status, self.gpu_phases = status, phases

    def recent_ttft_p99(self, window: int = 200) -> float | None:
        """TTFT p99 over the last `window` finished requests (None before there are 20)."""
        with self.lock:
            recent = [r["ttft_s"] for r in list(self.finished)[-window:] if r.get("ttft_s") == r.get("ttft_s")]
        return float(np.quantile(recent, 0.99)) if len(recent) >= 20 else None

    def take_new_rows(self) -> list[dict[str, object]]:
        with self.lock:
            rows, self.new_rows = self.new_rows, []
            return rows
