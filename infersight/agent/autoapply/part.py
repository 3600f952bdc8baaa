"""AutoApplyPart: the closed loop as one of the agent's parts (agent.component).

Each poll: the ring's request events go into RequestSamples (on_frames); then (end_poll, at most every
TICK_S) the loop judges the change in flight, or, when none is and the cool-down has passed, proposes
the next one: speculation first (the advice by task, then a disabled task's periodic re-check), then
max_num_seqs (against the SLO). Bounded: one change in flight across both knobs (a max_num_seqs window
during a speculation canary would measure both at once), a cool-down after each verdict.

An engine that takes no run-time policy (vLLM: no control block) is never written to; its advice is
rendered as flags (agent.autoapply.vllm_flags) in GET /api/v1/decisions.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd
from prometheus_client.core import Metric

from infersight.agent.autoapply.config import AutoApplyConfig
from infersight.agent.autoapply.decisions import Decision, DecisionLog
from infersight.agent.autoapply.policy_writer import PolicyWriter
from infersight.agent.autoapply.samples import RequestSamples
from infersight.agent.autoapply.seq_trial import SeqTrial
from infersight.agent.autoapply.speculation_canary import SpeculationCanary, proposal
from infersight.agent.component import Component
from infersight.correlate.frames import EventFrames

log = logging.getLogger("infersight.agent")

#: The loop looks at its samples at most this often (seconds): verdicts need seconds of data anyway.
TICK_S = 0.5


class _Collector:
    def __init__(self, decisions: DecisionLog) -> None:
        self.decisions = decisions

    def collect(self) -> Iterator[Metric]:
        return self.decisions.collect()


class AutoApplyPart(Component):
    name = "autoapply"

    def __init__(self, config: AutoApplyConfig, advice: Callable[[], list[dict[str, Any]]],
                 rings: Callable[[], list[str]], clock: Callable[[], int] = time.monotonic_ns) -> None:
        """advice: the speculation advice by task now (correlate.spec_advice.recommendations);
        rings: the names of the rings the agent reads; clock: monotonic ns (the engine's clock)."""
        self.config, self.advice, self.clock = config, advice, clock
        self.samples = RequestSamples()
        self.decisions = DecisionLog()
        self.writer = PolicyWriter(rings)
        rng = np.random.default_rng(config.seed)
        self.speculation = (SpeculationCanary(config, self.decisions, self.writer, rng)
                            if "speculation" in config.knobs else None)
        self.seq = SeqTrial(config, self.decisions, self.writer, rng) if "max-num-seqs" in config.knobs else None
        self._cool_until = 0
        self._next_tick = 0
        self._next_change = 1

    def on_frames(self, frames: EventFrames, ring_index: int, anchor: tuple[int, int]) -> None:
        self.samples.add(frames, ring_index)

    def end_poll(self, had_batches: bool) -> None:
        now = self.clock()
        if now >= self._next_tick:
            self._next_tick = now + int(TICK_S * 1e9)
            self.tick(now)

    def collector(self) -> _Collector:
        return _Collector(self.decisions)

    def tick(self, now: int) -> None:
        """Judge the change in flight, or start the next one (see the module docstring)."""
        frame = self.samples.frame()
        for knob in (self.speculation, self.seq):
            if knob is not None and knob.current is not None:
                if knob.evaluate(frame, now) is not None:
                    self._cool_until = now + int(self.config.cooldown_s * 1e9)
                return
        if now < self._cool_until or not self.writer.writable:
            return
        if self.speculation is not None:
            chosen = proposal(self.advice(), self.speculation.in_force, self.speculation.refused, now)
            if chosen is not None:
                self.speculation.start(chosen, self._take_change_id(), now)
                return
            task = self.speculation.recheck_due(now)
            if task is not None:  # a disabled task's periodic canary the other way (speculation_canary)
                self.speculation.start_recheck(task, self._take_change_id(), now)
                return
        if self.seq is not None:
            trial = self.seq.candidate(frame)
            if trial is not None:
                self.seq.start(*trial, self._take_change_id(), now)

    def _take_change_id(self) -> int:
        self._next_change += 1
        return self._next_change - 1

    def close(self) -> None:
        self.writer.close()


def span_event_listener(provider: Any) -> Callable[[Decision], None]:
    """A DecisionLog listener that exports each decision as a span "infersight.autoapply.decision" with
    one event named by its stage (tracing on: the OTLP pipeline's tracer provider)."""
    tracer = provider.get_tracer("infersight.autoapply")

    def emit(d: Decision) -> None:
        attrs = {"infersight.autoapply.knob": d.knob, "infersight.autoapply.target": d.target,
                 "infersight.autoapply.stage": d.stage, "infersight.autoapply.change_id": d.change_id,
                 "infersight.autoapply.before": str(d.before), "infersight.autoapply.after": str(d.after),
                 "infersight.autoapply.policy_seq": d.policy_seq, "infersight.autoapply.reason": d.reason[:1000]}
        try:
            with tracer.start_as_current_span("infersight.autoapply.decision", attributes=attrs) as span:
                span.add_event(d.stage, attrs)
        except Exception:  # noqa: BLE001 -- tracing must never stop the loop
            log.exception("decision %d: span event not exported", d.decision_id)

    return emit


#: The speculation advice is recomputed at most this often (seconds; or every minimum window when that
#: is shorter): it reads every kept verification.
ADVICE_EVERY_S = 5.0


def verifications_since(spec: pd.DataFrame, since: dict[str, int]) -> pd.DataFrame:
    """The verifications (correlate.frames SPEC_COLUMNS: ts_ns, task, ...) of each task at or after
    since[task] (ns, the engine's clock); a task not in `since` keeps all of its own."""
    if not since or spec.empty:
        return spec
    return spec[spec["ts_ns"].to_numpy() >= spec["task"].map(since).fillna(0).to_numpy()]


def attach_autoapply(config: AutoApplyConfig, state: Any, rings: Callable[[], list[str]],
                     tracer_provider: Any | None) -> AutoApplyPart | None:
    """The loop the agent runs (None when --auto-apply is not given): its advice from the state's
    verifications and step timings (correlate.spec_advice), its decisions as span events when tracing
    is on (tracer_provider: the OTLP pipeline's).

    A task's advice counts only its verifications after the loop's last kept change of it: once a
    re-check turned speculation back on, the verifications from before (which had it turned off)
    describe conditions the measured A/B just contradicted."""
    if not config.on:
        return None
    from infersight.correlate import spec_advice, spec_speedup

    cache: dict[str, Any] = {"at": -1e18, "advice": [], "since": {}}

    def advice() -> list[dict[str, Any]]:
        now = time.monotonic()
        since = dict(part.speculation.changed_at) if part.speculation is not None else {}
        if now - cache["at"] >= min(ADVICE_EVERY_S, config.min_window_s) or since != cache["since"]:
            by_task = spec_speedup.speedup_by_task(verifications_since(state.spec_events, since),
                                                   state.spec_step_timing,
                                                   spec_speedup.model_error(state.engine_on_gpu))
            cache.update(at=now, advice=spec_advice.recommendations(by_task), since=since)
        return list(cache["advice"])

    part = AutoApplyPart(config, advice, rings)
    if tracer_provider is not None:
        part.decisions.listeners.append(span_event_listener(tracer_provider))
    return part
