"""The flight recorder: an always-on kernel view from short sampled windows, inside a measured budget.

Each agent poll (`FlightRecorder.poll`):
  1. the new STEP records extend a bounded step history; steps that ran requests earn budget;
  2. a finished window is read with the kernel analysis (agent.recorder.window) and folded into the
     KERNEL_METRICS counters; its summary waits for its cost;
  3. windows and triggered captures whose charged steps have all arrived get their measured cost
     (agent.recorder.budget.window_cost); the budget settles; the summary is kept (WindowStore);
  4. the triggers (agent.recorder.triggers) may take one full capture through the agent's capture
     controller (rate-limited there too, one at a time, listed at /api/v1/captures with its reason);
  5. when the budget allows and nothing else is capturing, the next window is asked for: a few
     steps, kernel activity only (CaptureTool.TORCH_KERNELS: no shapes, no stacks).

Its counters, gauges and summary block are built by agent.recorder.view.

The agent pauses its profiling GPU counters around every window as around captures
(CaptureController.in_progress). Nothing here runs in the engine: it pays for the window itself
(measured and exported) and one integer comparison per step otherwise.
"""
from __future__ import annotations

import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from infersight.agent.capture.controller import CaptureController, CaptureRecord, CaptureRefused
from infersight.agent.recorder.budget import WindowBudget, WindowCost, window_cost
from infersight.agent.recorder.config import RecorderConfig
from infersight.agent.recorder.store import WindowStore
from infersight.agent.recorder.triggers import TriggerGate, preemption_storm, slo_breach, step_time_jump
from infersight.agent.recorder.view import GaugeRows, fold_window, gauge_rows, summary_block, zero_recorder_series
from infersight.agent.recorder.window import analyze_window
from infersight.agent.state import AgentState
from infersight.correlate.kernel_windows import WindowSummary
from infersight.exporters import catalogue as C
from infersight.kernels.ceilings.ceiling_lookup import CeilingQuery
from infersight.kernels.ceilings.device_ceilings import DeviceCeilings
from infersight.kernels.frames import TraceError
from infersight.kernels.readers.shapes import shapes_path_for

log = logging.getLogger("infersight.agent")
#: Steps kept for the triggers and the baselines. While a window or capture is in flight or waiting for
#: its cost, every step from PIN_BEFORE_STEPS before its request on is kept too, up to MAX_HELD_STEPS
#: (about 3 MiB): a starved agent reads thousands of steps in one poll (a loaded 2-core host beside a
#: CPU vLLM: polls of 3.7-18 s, up to 7,505 steps), which pushed a window's own steps and its baseline
#: out before its cost was measured (it was then settled at its estimate, 30 s later).
HISTORY_STEPS = 4096
PIN_BEFORE_STEPS = 128
MAX_HELD_STEPS = 1 << 16
STEP_FIELDS = ["step_id", "start_ns", "end_ns", "batch_size", "prefill_tokens", "preempted"]
#: A window or capture whose cost cannot be measured (the engine stopped; steps lost to ring drops) is
#: settled at its estimate after this long, or once the engine is this many steps past it.
COST_WAIT_S = 30.0
COST_WAIT_STEPS = 64
#: Busy steps a window waits for after the last one a window affected: its baseline.
BASELINE_STEPS = 8
#: The engine is idle when none of its last IDLE_STEPS steps ran a request. Not the last step alone: a
#: starved agent gets the CPU when vLLM pauses between requests, so its newest step was, poll after
#: poll, the one between two requests with none running (a live run: 66 polls refused as idle, 4 windows).
IDLE_STEPS = 4


class FlightRecorder:
    def __init__(self, config: RecorderConfig, state: AgentState, captures: CaptureController,
                 slos: dict[str, float]) -> None:
        self.config, self.state, self.captures, self.slos = config, state, captures, slos
        self.budget = WindowBudget(config.budget, config.initial_cost_s)
        self.store = WindowStore(config.keep, config.max_bytes, config.directory)
        # A restarted agent starts from what windows cost this engine last time, not from the guess.
        self.budget.seed(self.store.kept_costs(self.budget.recent_windows))
        self.gate = TriggerGate(config.trigger_cooldown_s)
        # Looked up per window for the device that ran it (agent.recorder.window), given peaks first.
        self.ceiling_query = CeilingQuery(peak_tflops=config.peak_tflops, peak_gbps=config.peak_gbps,
                                          given_as=("--recorder-peak-tflops", "--recorder-peak-gbps"))
        self.history = pd.DataFrame({c: pd.Series(dtype="int64") for c in STEP_FIELDS})
        self._keep_from: int | None = None  # the oldest step id a window or capture may still need
        self._read_s = 0.0  # when the rings were last read (poll's read_s)
        self.affected: deque[tuple[int, int]] = deque(maxlen=256)  # (first, last) step ids a window touched
        self._pending: list[dict[str, Any]] = []   # windows / captures waiting for their cost
        self._triggered: list[tuple[CaptureRecord, str]] = []  # triggered captures not yet ended
        self._last_window_wall = -1e18
        self.ceilings_used: DeviceCeilings | None = None  # of the last window placed against a known ceiling
        self.roof_fraction: dict[str, float] = {}
        self.triggers: deque[dict[str, Any]] = deque(maxlen=64)
        self.costs: deque[dict[str, float]] = deque(maxlen=256)
        self.vllm = None  # windows through vLLM's profiler endpoints (agent.recorder.vllm_windows)
        if captures.target is not None and captures.target.name.startswith("vllm:"):
            from infersight.agent.recorder.vllm_windows import VllmWindows

            self.vllm = VllmWindows(captures.target.name)
            if not (state.config.rings or state.config.discover):
                log.warning("flight recorder on %s: no probe ring attached, so no STEP records to measure a "
                            "window against; it takes none. Attach the stat-logger plugin's ring (--ring "
                            "infersight-vllm-<api-server pid>, or --discover --discover-prefix infersight-vllm-)",
                            captures.target.name)
        with state.lock:
            zero_recorder_series(state.counters)

    # -- 1. steps -------------------------------------------------------------------------------
    def add_steps(self, steps: pd.DataFrame) -> None:
        """New STEP records (correlate.frames steps)."""
        if steps.empty:
            return
        new = steps[STEP_FIELDS].astype("int64")
        if {"running", "decode_tokens"} <= set(steps.columns) and not (new["batch_size"] > 0).any():
            # An engine that reports no batch membership (vLLM's stat logger writes batch_size 0): the
            # requests that decoded in the step, or that run after it, or 1 for a prefill-only step.
            size = np.maximum(steps["running"].to_numpy(np.int64), steps["decode_tokens"].to_numpy(np.int64))
            new["batch_size"] = np.where((size == 0) & (new["prefill_tokens"].to_numpy() > 0), 1, size)
        busy = new[new["batch_size"] > 0]
        seconds = float((busy["end_ns"] - busy["start_ns"]).sum()) / 1e9
        self.budget.earn(seconds)
        with self.state.lock:
            self.state.counters[C.RECORDER_ENGINE.name].inc((), seconds)
        both = pd.concat([self.history, new], ignore_index=True) if not self.history.empty else new
        keep = HISTORY_STEPS
        if self._keep_from is not None:
            keep = min(MAX_HELD_STEPS, max(keep, int((both["step_id"] >= self._keep_from).sum())))
        self.history = both.iloc[-keep:].reset_index(drop=True)

    def _pin_history(self) -> None:
        """A window or capture was asked for: the steps just before it (its baseline) and every step
        after stay in the history until its cost is measured (module constants)."""
        start = int(self.history["step_id"].max()) - PIN_BEFORE_STEPS if not self.history.empty else 0
        self._keep_from = start if self._keep_from is None else min(self._keep_from, start)

    def _unpin_history(self) -> None:
        if self._keep_from is not None and not self._pending and not self._triggered \
                and not self.captures.in_progress():
            self._keep_from = None
            self.history = self.history.iloc[-HISTORY_STEPS:].reset_index(drop=True)

    def _affected_ids(self) -> np.ndarray:
        ids = [np.arange(a, b + 1) for a, b in self.affected]
        return np.concatenate(ids) if ids else np.zeros(0, np.int64)

    # -- the poll -------------------------------------------------------------------------------
    def poll(self, rings: list[str], now_s: float | None = None, read_s: float | None = None) -> None:
        """now_s: time.monotonic() now; read_s: when the rings were read for the steps added last
        (None: now). A poll that folded thousands of steps ends seconds after its read: judged at
        now, a busy vLLM would look idle (its newest step seconds old) and no window would start."""
        now = time.monotonic() if now_s is None else now_s
        self._read_s = now if read_s is None else read_s
        self._collect_window(now)
        self._collect_triggered(now)
        self._measure(now)
        self._unpin_history()
        self._check_triggers(rings, now)
        self._maybe_start(rings, now)
        self.publish()

    # -- 2. a finished window -------------------------------------------------------------------
    def _collect_window(self, now: float) -> None:
        record = self.captures.poll_window()
        if record is None:
            return
        first_step, steps = self._first_step(record)
        entry: dict[str, Any] = {"kind": "window", "first_step": first_step, "steps": steps,
                                 "wall": record.requested_wall, "done_s": now, "path": record.path}
        vllm = self.vllm is not None and self.vllm.owns(record)
        if vllm:
            entry["profiler"] = self.vllm.timings(record)
            entry["until_ns"] = self.vllm.charge_until_ns(record)
        if record.state == "done" and record.path:
            try:
                analyze = self.vllm.analyze if vllm else analyze_window
                summary, lookup = analyze(record.path, first_step, self.ceiling_query)
            except (TraceError, OSError, ValueError) as exc:
                entry["error"] = str(exc)
            else:
                self._fold(summary)
                entry["summary"] = summary.as_dict()
                if lookup is not None:  # the window placed a roofline: against these ceilings, or none known
                    entry["ceilings"] = lookup.as_dict()
                    self.ceilings_used = lookup.ceilings or self.ceilings_used
            finally:
                if not self.config.keep_traces:
                    self._delete_trace(record.path)
        else:  # a ring's failed window carries the engine's error as its path; a target's, in its analysis
            entry["error"] = (record.analysis or {}).get("error") or record.path or "the engine wrote no trace"
            entry.pop("path", None)
        outcome = "analysed" if "summary" in entry else "failed"
        with self.state.lock:
            self.state.counters[C.RECORDER_WINDOWS.name].inc((outcome,))
        self._pending.append(entry)

    @staticmethod
    def _delete_trace(path: str) -> None:
        for p in (Path(path), shapes_path_for(path)):
            try:
                os.unlink(p)
            except OSError:
                pass

    def _fold(self, s: WindowSummary) -> None:
        """A window's summary into the KERNEL_METRICS counters and the roofline gauge."""
        with self.state.lock:
            self.roof_fraction.update(fold_window(self.state.counters, s))

    # -- 3. costs -------------------------------------------------------------------------------
    def _first_step(self, record: CaptureRecord) -> tuple[int, int]:
        """(the engine step a window or capture began with, the steps it is charged before the after-steps)."""
        if self.vllm is not None and self.vllm.owns(record):
            return self.vllm.first_step(self.history, record), self.vllm.charged_steps(record)
        return self.captures.first_step(record), record.steps

    def _collect_triggered(self, now: float) -> None:
        for record, reason in list(self._triggered):
            if record.state in ("requested", "running"):
                continue
            self._triggered.remove((record, reason))
            first_step, steps = self._first_step(record)
            self._pending.append({"kind": "triggered", "first_step": first_step,
                                  "steps": steps, "wall": record.requested_wall, "done_s": now,
                                  "reason": reason, "capture_id": record.capture_id})
            if self.vllm is not None and self.vllm.owns(record):
                self._pending[-1]["until_ns"] = self.vllm.charge_until_ns(record)

    def _measure(self, now: float) -> None:
        not_before = max((b for _, b in self.affected), default=-1)
        for entry in list(self._pending):
            if entry.get("until_ns") is not None and self.vllm is not None:  # charged through its trace's end
                steps = self.vllm.steps_until(self.history, entry["first_step"], entry["until_ns"],
                                              entry.setdefault("min_steps", entry["steps"]))
                if steps is None and now - entry["done_s"] < COST_WAIT_S:
                    continue
                entry["steps"] = steps or entry["steps"]
            cost = window_cost(self.history, entry["first_step"], entry["steps"], self.config.after_steps,
                               not_before=not_before)
            end = entry["first_step"] + entry["steps"] + self.config.after_steps
            newest = int(self.history["step_id"].max()) if not self.history.empty else -1
            if cost is None and now - entry["done_s"] < COST_WAIT_S and newest < end + COST_WAIT_STEPS:
                continue
            self._pending.remove(entry)
            self._settle(entry, cost)

    def _settle(self, entry: dict[str, Any], cost: WindowCost | None) -> None:
        window = entry["kind"] == "window"
        # Below zero the steps ran faster than their baseline (jitter, or step times drifting down, as
        # a new long request's do after the last one's): charged nothing, never credited. The cost
        # counter is a Prometheus counter (a decrease reads as a reset), and noise earns no allowance.
        measured = max(cost.cost_s, 0.0) if cost is not None else self.budget.reserve_s
        if cost is None:
            held = (int(self.history["step_id"].min()), int(self.history["step_id"].max())) if len(self.history) \
                else (-1, -1)
            log.info("flight recorder: %s from step %d (%d steps) settled at its %.3f s estimate: its cost could "
                     "not be measured (steps %d..%d held)", entry["kind"], entry["first_step"], entry["steps"],
                     measured, *held)
        if window:
            self.budget.settle(measured, update_estimate=cost is not None)
        else:
            self.budget.charge(measured)
        last = entry["first_step"] + entry["steps"] + self.config.after_steps - 1
        self.affected.append((entry["first_step"], last))
        with self.state.lock:
            self.state.counters[C.RECORDER_COST.name].inc(("window" if window else "triggered",), measured)
        entry["charged_s"] = measured  # what the budget and the cost counter were charged (the estimate if unmeasured)
        entry["cost"] = None if cost is None else {"cost_s": cost.cost_s, "noise_s": cost.noise_s,
                                                   "base_period_s": cost.base_period_s,
                                                   "charged_steps": cost.charged_steps}
        if cost is not None:
            self.costs.append({"kind": entry["kind"], "cost_s": cost.cost_s, "noise_s": cost.noise_s})
        entry.pop("done_s", None)
        if window and not self.config.keep_traces:
            entry.pop("path", None)
        self.store.add(entry)

    # -- 4. triggers ----------------------------------------------------------------------------
    def _check_triggers(self, rings: list[str], now: float) -> None:
        cfg = self.config
        if not self.gate.open(now) or self.captures.in_progress() or self.history.empty:
            return
        trigger = None
        if self.slos:
            with self.state.lock:
                finished = self.state.finished.tail(cfg.slo_window)
            if not finished.empty:
                trigger = slo_breach(finished, self.slos, cfg.slo_quantile, cfg.slo_window, cfg.slo_min_requests)
        if trigger is None and cfg.preemption_storm is not None:
            trigger = preemption_storm(self.history, cfg.preemption_storm, cfg.storm_steps)
        if trigger is None and cfg.step_jump is not None:
            trigger = step_time_jump(self.history, self._affected_ids(), cfg.step_jump)
        if trigger is None:
            return
        try:
            record = self.captures.request(rings, cfg.trigger_steps, "torch",
                                           reason=f"trigger {trigger.reason}: {trigger.detail}")
        except CaptureRefused as exc:
            log.info("flight recorder: trigger %s not taken (%s)", trigger.reason, exc)
            return
        self.gate.fired(now)
        self._pin_history()
        self._triggered.append((record, trigger.reason))
        self.triggers.append({"reason": trigger.reason, "detail": trigger.detail, "capture_id": record.capture_id,
                              "wall": record.requested_wall})
        with self.state.lock:
            self.state.counters[C.RECORDER_TRIGGERED.name].inc((trigger.reason,))
        log.info("flight recorder: full capture %d on %s (%s)", record.capture_id, trigger.reason, trigger.detail)

    # -- 5. the next window ---------------------------------------------------------------------
    def _maybe_start(self, rings: list[str], now: float) -> None:
        if not self.budget.can_start() or now - self._last_window_wall < self.config.min_interval_s:
            return
        if self._pending or self.captures.in_progress() or self.history.empty:
            return  # one window's cost is known before the next is taken
        if not (self.history["batch_size"].iloc[-IDLE_STEPS:] > 0).any():
            return  # an idle engine: a window of empty steps says nothing
        if self.vllm is not None and not self.vllm.stepping(self.history, self._read_s):
            return  # vLLM writes no step when idle: its last (busy) step is just old
        since = self.history[self.history["step_id"] > max((b for _, b in self.affected), default=-1)]
        if int((since["batch_size"] > 0).sum()) < BASELINE_STEPS + 1:
            return  # its cost is measured against the steps before it: let a few come first
        try:
            self.captures.request_window(rings, self.config.window_steps)
        except CaptureRefused as exc:
            with self.state.lock:
                self.state.counters[C.RECORDER_WINDOWS.name].inc(("refused",))
            log.debug("flight recorder: window refused (%s)", exc)
            return
        self.budget.reserve()
        self._pin_history()
        self._last_window_wall = now

    # -- what it shows ----------------------------------------------------------------------------
    def gauge_rows(self) -> GaugeRows:
        """The recorder's gauges as (spec, [(label values, value)]) (exporters.recorder renders them)."""
        return gauge_rows(self.budget, self.roof_fraction, self.ceilings_used)

    def publish(self) -> None:
        """The summary block into the agent state (report.summary shows it)."""
        block = summary_block(self.budget, self.costs, self.store, self.triggers)
        with self.state.lock:
            self.state.recorder_summary = block
