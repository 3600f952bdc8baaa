"""AgentState: everything the agent knows, updated one batch of events at a time.

Per batch the analyses in `correlate` run on the new frames (plus what is carried over: events
of requests still in flight, steps still waiting for their batch rows). The results are folded
into cumulative counters and histograms that the exporters render. A lock guards the state
between the ingest thread and the HTTP handlers; the engine never takes it.

Each stream has its fold in agent/folds/, one concept per file: steps and batch rows (folds.step),
KV blocks (folds.kv), MoE and expert-parallel records (folds.expert), prefix lookups (folds.prefix),
verifications (folds.spec), served requests' network timing (folds.network_hold), GPU energy
(folds.energy_account), and the requests themselves (folds.request_ledger, which judges the slow
ones with agent.slow_judge). AgentState runs them in order under its lock and is what the rest of the agent reads.

With the engine label on (several rings: agent.rings.engine_scope) the folds count through views that add
each batch's engine to the engine families' labels, and the state keeps each engine's last step and
expert matrix for the gauges (engine_views).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable

import numpy as np
import pandas as pd

from infersight.agent.config import AgentConfig
from infersight.agent.rings.engine_scope import EngineScope, EngineView, RingEngine
from infersight.agent.folds.energy_account import EnergyAccount
from infersight.agent.energy_meter import EnergyMeter
from infersight.agent.folds.expert import EP_WINDOW, ExpertFold
from infersight.agent.rows.finished_rows import FinishedRows, row_dicts
from infersight.agent.folds.kv import KvFold
from infersight.agent.folds.network_hold import MAX_OPEN_REQUESTS, NetworkHold
from infersight.agent.folds.prefix import PrefixFold
from infersight.agent.folds.request_ledger import RequestLedger
from infersight.agent.slow.judge import SlowJudge
from infersight.agent.folds.spec import SPEC_STEP_WINDOW, SPEC_WINDOW, SpecFold
from infersight.agent.folds.host_pause import HostPauseFold
from infersight.agent.folds.step import MAX_ATTRIBUTION_STEPS, MAX_PENDING_STEPS, RECENT_BATCH_ROWS, StepFold
from infersight.correlate import slow_rule
from infersight.correlate.frames import EventFrames
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter, LabelledHistogram
from infersight.gpu.samples import GpuSample

__all__ = ["AgentState", "EP_WINDOW", "MAX_ATTRIBUTION_STEPS", "MAX_OPEN_REQUESTS", "MAX_PENDING_STEPS",
           "NETWORK_WAIT_S", "RECENT_BATCH_ROWS", "SPEC_STEP_WINDOW", "SPEC_WINDOW"]

#: How long a served request's row waits for its NETWORK record before it is computed without one
#: (read at each poll, so a test can shorten it).
NETWORK_WAIT_S = 10.0


class AgentState:
    def __init__(self, config: AgentConfig,
                 on_rows: Callable[[pd.DataFrame, pd.DataFrame], None] | None = None) -> None:
        """on_rows: called under the lock with each batch of finished rows and their request events
        (the agent's tracing)."""
        self.config = config
        self.lock = threading.Lock()
        self.started_wall = time.time()
        self.counters = {spec.name: LabelledCounter() for spec in C.CATALOGUE if spec.kind == "counter"}
        self.histograms = {spec.name: LabelledHistogram(spec.buckets or ()) for spec in C.CATALOGUE
                           if spec.kind == "histogram"}
        # The folds count through the scope's views: the dicts above themselves with the engine label off.
        self.scope = EngineScope(config.engine_label.enabled(len(config.rings), config.discover))
        counters, histograms = self.scope.counters(self.counters), self.scope.histograms(self.histograms)
        self.energy_account = EnergyAccount(counters, config.gpu.energy_gpus,
                                            wait_s=max(5.0, 4 * config.gpu.interval_s),
                                            fit_min_span_ns=int(config.gpu.energy_fit_min_s * 1e9),
                                            hold_idle_static=config.gpu.energy_static == "idle")
        self.steps = StepFold(counters, histograms, self.energy_account)
        self.kv = KvFold(counters, histograms, seed_zero_series=not self.scope.on)
        self.experts = ExpertFold()
        self.prefix = PrefixFold(counters, config.retention.requests)
        self.spec = SpecFold(counters)
        self.network_hold = NetworkHold()
        self.judge = SlowJudge(config.slow)
        self.host_pauses = HostPauseFold(counters)
        self.ledger = RequestLedger(counters, histograms, config.retention.rows_bytes, self.steps,
                                    self.energy_account, self.network_hold, self.kv, self.spec, self.judge,
                                    self.host_pauses,
                                    self._kernel_seconds_of, self._emit_rows, scope=self.scope)
        self.engine_last_step: dict[str, dict[str, int]] = {}  # with the engine label: each engine's last step
        self.engine_experts: dict[str, ExpertFold] = {}  # with the engine label: each engine's expert matrix
        self.ring_engines: dict[str, str] = {}  # ring name -> its engine (the probe counters' engine label)
        self._no_request_events = EventFrames().request_events  # releases held rows without new events
        self.ring_stats: dict[str, dict[str, int]] = {}
        self.engine_on_gpu = False  # an engine reported the GPUs it uses (GPU records): spec_speedup.model_error
        self.source_stats: dict[str, dict[str, object]] = {}  # non-ring sources (e.g. vLLM KV events): their health
        self.wall_anchor: tuple[int, int] = (time.time_ns(), time.monotonic_ns())
        self.kernel_by_request: OrderedDict[int, dict[str, object]] = OrderedDict()  # from captures
        self.recorder_summary: dict[str, object] | None = None  # the flight recorder's block (agent.recorder.flight_recorder)
        self.gpu_status = "GPU telemetry: not started"
        self.gpu_phases: list[dict[str, object]] = []
        self.on_rows = on_rows

    # -- what the rest of the agent reads (each fold owns its part) ---------------------------------
    @property
    def engine_label(self) -> bool:
        """Whether the engine families' label tuples end with the engine (agent.rings.engine_scope)."""
        return self.scope.on

    @property
    def energy(self) -> EnergyMeter:
        return self.energy_account.meter

    @property
    def last_step(self) -> dict[str, int]:
        """The newest step record's fields ({} before the first step)."""
        return self.steps.last_step

    @property
    def finished(self) -> FinishedRows:
        """The last finished requests' rows, oldest first, within retention.rows_bytes (frames, or dicts when iterated)."""
        return self.ledger.finished

    @property
    def requests_seen(self) -> int:
        """ARRIVED events counted so far."""
        return self.ledger.requests_seen

    @property
    def slow_rule(self) -> slow_rule.SlowRule:
        return self.judge.rule

    @property
    def expert_tokens(self) -> np.ndarray:
        """Tokens routed to each (layer, expert) so far: row = layer, column = expert."""
        return self.experts.expert_tokens

    @expert_tokens.setter
    def expert_tokens(self, value: np.ndarray) -> None:
        self.experts.expert_tokens = value

    @property
    def ep_events(self) -> pd.DataFrame:
        """Expert-parallel records of the last EP_WINDOW (step, layer, rank) rows."""
        return self.experts.ep_events

    @property
    def prefix_groups(self) -> dict[int, list[int]]:
        """Group hash -> [requests, cached tokens, prompt tokens] (bounded)."""
        return self.prefix.groups

    @property
    def spec_events(self) -> pd.DataFrame:
        """The last SPEC_WINDOW verifications, one frame (the same object until the next poll adds some)."""
        return self.spec.events

    @property
    def spec_step_timing(self) -> pd.DataFrame:
        """Recent speculative and plain-probe steps (step_timing rows), at most SPEC_STEP_WINDOW."""
        return self.spec.step_timing

    @property
    def awaiting_network(self) -> dict[int, float]:
        """Served requests whose row waits for its NETWORK record (id -> since when, 0: not yet)."""
        return self.network_hold.awaiting

    @property
    def network(self) -> dict[int, tuple[int, int]]:
        """Network timing of served requests not yet finished: id -> (receive_ns, last_byte_ns)."""
        return self.network_hold.timing

    # -- ingest -------------------------------------------------------------------------------------
    def ingest(self, frames: EventFrames, source: RingEngine | None = None) -> None:
        """One batch of a ring (source: which ring, of which engine; None: not a ring's, e.g. vLLM's
        KV events)."""
        with self.lock:
            if self.scope.on:
                self._enter(source)
            self.steps.fold(frames)
            self.kv.fold(frames.kv_events, self.steps.last_step.get("kv_block_size", 16))
            self.experts.fold_moe(frames.moe)
            if self.scope.on:
                engine = self.scope.current
                if not frames.steps.empty:
                    self.engine_last_step[engine] = dict(self.steps.last_step)
                if not frames.moe.empty:
                    if engine not in self.engine_experts:  # (an ExpertFold costs a frame: not one per batch)
                        self.engine_experts[engine] = ExpertFold()
                    self.engine_experts[engine].fold_moe(frames.moe)
            self.prefix.fold(frames.prefix)
            self.spec.fold(frames.spec)
            self.spec.fold_steps(frames.step_timing)
            self.experts.fold_ep(frames.ep)
            self.network_hold.note(frames)
            self.host_pauses.fold(frames.host_pauses)  # before the requests they stalled are judged
            self.ledger.fold(frames.request_events, NETWORK_WAIT_S)
            oldest_open_ns = self.ledger.oldest_open_ns()
            self.steps.trim_attribution(oldest_open_ns)
            self.host_pauses.trim(oldest_open_ns)

    def note_rings(self, engines: dict[str, str]) -> None:
        """Ring name -> the engine it announced (or its own name), for the probe counters' engine label."""
        if not self.scope.on:
            return
        with self.lock:
            self.ring_engines.update(engines)

    def _enter(self, source: RingEngine | None) -> None:
        """The engine label's scope for a batch from `source`; an engine's zero series at its first."""
        if source is not None:
            self.ring_engines[source.ring] = source.engine
        if self.scope.enter(source.engine if source is not None else None,
                            source.index if source is not None else None):
            self.kv.seed_zero_series()

    def engine_views(self) -> dict[str, EngineView]:
        """With the engine label on: each engine's last step, expert matrix and speculative windows
        (the exposition's gauges); called under the lock."""
        spec, timing = self.spec_events, self.spec_step_timing
        spec_engine = self.scope.engines_of(spec["request_id"].to_numpy(np.int64))
        timing_engine = self.scope.engines_of(timing["step_id"].to_numpy(np.int64))
        names = sorted(set(self.engine_last_step) | set(self.engine_experts) | set(spec_engine.tolist()))
        return {name: EngineView(self.engine_last_step.get(name, {}),
                                 self.engine_experts[name].expert_tokens if name in self.engine_experts
                                 else np.zeros((0, 0), dtype=np.int64),
                                 spec[spec_engine == name], timing[timing_engine == name]) for name in names}

    def _emit_rows(self, rows: pd.DataFrame, events: pd.DataFrame) -> None:
        if self.on_rows is not None:
            self.on_rows(rows, events)

    def set_source_stats(self, source: str, stats: dict[str, object]) -> None:
        """A non-ring source's health (vLLM KV events, the OTLP export), for the summary's `sources`."""
        self.source_stats[source] = stats

    def count_rejected(self, rejected: dict[tuple[str, str], int]) -> None:
        """Probe records the agent refused since the last call, {(ring, reason): n} (agent.rings.record_limits)."""
        if rejected:
            with self.lock:
                for labels, n in rejected.items():
                    if self.scope.on:  # (ring, reason, the ring's engine)
                        labels = (*labels, self.ring_engines.get(labels[0], labels[0]))
                    self.counters[C.PROBE_REJECTED.name].inc(labels, n)

    def set_ring_stats(self, stats: dict[str, dict[str, int]], anchor: tuple[int, int] | None) -> None:
        with self.lock:
            self.ring_stats = stats
            if anchor is not None:
                self.wall_anchor = anchor

    def _wall_s(self, mono_ns: int) -> float:
        wall, mono = self.wall_anchor
        return (wall + (mono_ns - mono)) / 1e9

    # -- GPU energy ------------------------------------------------------------------------------------
    def add_gpu_samples(self, samples: list[GpuSample]) -> None:
        """The sampler's readings (those not seen before count): measure the steps they now cover, and
        build the rows that were waiting for that."""
        with self.lock:
            if self.energy_account.add_samples(samples):
                self.ledger.fold(self._no_request_events, NETWORK_WAIT_S)

    def close_energy(self) -> None:
        """No more readings will come (the sampler stopped): the tail of the account is idle, and no
        row waits any longer."""
        with self.lock:
            self.energy_account.close()
            self.ledger.fold(self._no_request_events, NETWORK_WAIT_S)

    def kernel_seconds(self, request_id: int) -> float:
        """The request's share of GPU kernel time in profiler captures (NaN: no capture covered it)."""
        summary = self.kernel_by_request.get(request_id)
        return float(summary["kernel_ns"]) / 1e9 if summary else float("nan")  # type: ignore[arg-type]

    def _kernel_seconds_of(self, request_ids: np.ndarray) -> list[float]:
        if not self.kernel_by_request:  # no capture covered any request (the usual case): no lookups
            return [float("nan")] * len(request_ids)
        return [self.kernel_seconds(int(r)) for r in request_ids.tolist()]

    def recent_steps_frame(self) -> pd.DataFrame:
        with self.lock:
            frames = list(self.steps.recent_steps)
        return pd.concat(frames, ignore_index=True) if frames else EventFrames().steps

    def recent_batch_frame(self) -> pd.DataFrame:
        with self.lock:
            frames = list(self.steps.recent_batch)
        return pd.concat(frames, ignore_index=True) if frames else EventFrames().batch

    def add_kernel_summaries(self, summaries: dict[int, dict[str, object]]) -> None:
        with self.lock:
            self.kernel_by_request.update(summaries)
            while len(self.kernel_by_request) > self.config.retention.requests:
                self.kernel_by_request.popitem(last=False)

    def set_gpu_summary(self, status: str, phases: list[dict[str, object]]) -> None:
        with self.lock:
            self.gpu_status, self.gpu_phases = status, phases

    def recent_ttft_p99(self, window: int = 200) -> float | None:
        """TTFT p99 over the last `window` finished requests (None before there are 20)."""
        with self.lock:
            # Read from the newest kept blocks' arrays, every poll: building the kept rows' frames here
            # cost in proportion to retention (half the agent's CPU once 17,000 rows were kept, py-spy).
            recent = self.finished.last_values("ttft_s", window).astype(np.float64)
        recent = recent[~np.isnan(recent)]
        return float(np.quantile(recent, 0.99)) if len(recent) >= 20 else None

    def take_new_rows(self) -> list[dict[str, object]]:
        with self.lock:
            ledger = self.ledger
            frames, ledger.new_rows = ledger.new_rows, []
        return [row for rows in frames for row in row_dicts(rows)]

    def drop_new_rows(self) -> None:
        """Forget the rows take_new_rows would give (no sink wants them)."""
        with self.lock:
            self.ledger.new_rows = []
