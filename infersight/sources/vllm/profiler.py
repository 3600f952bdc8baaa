"""Captures on a vLLM server through its profiler endpoints (`--vllm-url` with `--vllm-profiler-dir`).

vLLM started with `--profiler-config '{"profiler": "torch", "torch_profiler_dir": DIR,
"torch_profiler_with_stack": false}'` serves POST /start_profile and /stop_profile. Keep stacks off:
with them a handful of requests gave 6-14 MB traces and /stop_profile took up to 51 s; without, a
20-step trace is tens of KiB. (`"ignore_frontend": true` also skips the API server's own trace,
which this module does not read.) One capture, on its own thread (the agent's loop never waits):

  1. list DIR's traces; read vLLM's step count (the scraper: vllm:iteration_tokens_total's count)
  2. POST /start_profile {"profile_prefix": "infersight-<id>-<random>", "max_iterations": N}: since
     vLLM 0.3x the worker's profiler stops itself after N engine steps, so the window is exactly N
     steps even though step 3 counts them late (the counter moves when outputs reach the API server)
  3. wait until the worker's trace appears (its profiler stopped itself after N steps), at most
     `step_wait_s` (an idle server takes no steps: the capture then covers the steps that came);
     flight-recorder windows wait at most WINDOW_STEP_WAIT_S
  4. POST /stop_profile: ends vLLM's session (the API server's own profiler, unless vLLM runs with
     "ignore_frontend": true; the worker's, writing its trace, when it has not stopped yet)
  5. wait, at most `trace_wait_s`, for the worker's trace: a new `*.pt.trace.json[.gz]` in DIR, not
     the API server's `*async_llm*` one, rank 0 first, ours by prefix when vLLM names it so, and
     readable (torch writes the gzip in place, so a half-written file is retried)
  6. analyse it (`analyze_vllm_trace`): the same report `infersight analyze` builds, over the GPU
     kernels or, on a CPU build, the CPU ops (kernels.analysis.cpu_trace), with vLLM's step ranges given
     our phases

Reading the traces (which one is ours, its step ranges, its analysis) is sources.vllm.trace's; its
names are re-exported here, where callers have imported them from.

Failures (vLLM refused or did not answer, no trace in time, a trace that does not parse) end the
capture as "failed" with {"error": why} as its analysis, are counted in capture_failures{reason}
and logged in one line each.
"""
from __future__ import annotations

import json
import logging
import secrets
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from infersight.sources.capture_target import CaptureOutcome, CaptureRefused
from infersight.exporters import catalogue as C
from infersight.kernels.frames import TraceError
from infersight.sources.vllm.trace import (TRACE_SUFFIXES, analyze_vllm_trace, complete_trace, pick_worker_trace,
                                           step_phase, trace_files, with_step_ranges)

__all__ = ["VllmProfilerConfig", "VllmProfilerTarget", "LARGE_TRACE_BYTES", "WINDOW_STEP_WAIT_S", "WINDOW_POLL_S",
           "TRACE_SUFFIXES", "analyze_vllm_trace", "pick_worker_trace", "step_phase", "trace_files",
           "with_step_ranges"]

log = logging.getLogger("infersight.agent")
LARGE_TRACE_BYTES = 5 << 20
WINDOW_STEP_WAIT_S = 5.0
WINDOW_POLL_S = 0.02


@dataclass(frozen=True)
class VllmProfilerConfig:
    """base_url: vLLM's server; profiler_dir: its torch_profiler_dir as this host sees it."""

    base_url: str
    profiler_dir: str
    step_wait_s: float = 60.0
    trace_wait_s: float = 60.0
    poll_s: float = 0.25
    http_timeout_s: float = 30.0


class VllmProfilerTarget:
    """A CaptureTarget (agent.capture) over vLLM's profiler endpoints. steps: vLLM's step count now
    (None when unknown), from the metrics scraper."""

    tools = ("torch",)

    def __init__(self, config: VllmProfilerConfig, steps: Callable[[], float | None]) -> None:
        self.config = config
        self.name = f"vllm:{config.base_url.rstrip('/')}"
        self.steps = steps
        self._lock = threading.Lock()
        self._outcome: CaptureOutcome | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._failures: dict[str, int] = {}
        self._poll_s = config.poll_s  # the capture in flight's: a window looks for its trace more often

    # -- the CaptureTarget protocol ------------------------------------------------------------------
    def start(self, capture_id: int, steps: int) -> None:
        self._launch(capture_id, steps, analyse=True)

    def start_window(self, capture_id: int, steps: int) -> None:
        """A flight-recorder window: like start(), but the trace is only checked to be complete, not
        analysed here (agent.recorder.vllm_windows reads it into the window's summary)."""
        self._launch(capture_id, steps, analyse=False)

    def _launch(self, capture_id: int, steps: int, analyse: bool) -> None:
        if self._thread is not None and self._thread.is_alive():
            raise CaptureRefused(409, "a vLLM capture is still finishing; one at a time")
        self._outcome = None
        self._thread = threading.Thread(target=self._run, args=(capture_id, steps, analyse), daemon=True,
                                        name=f"infersight-vllm-capture-{capture_id}")
        self._thread.start()

    def poll(self) -> CaptureOutcome | None:
        with self._lock:
            outcome, self._outcome = self._outcome, None
        return outcome

    def close(self) -> None:
        self._closing.set()  # a capture in flight stops waiting, calls /stop_profile and ends
        if self._thread is not None:
            self._thread.join(timeout=self.config.http_timeout_s)

    def collector(self) -> Collector:
        return _FailureCounts(self)

    def failures(self) -> dict[str, int]:
        with self._lock:
            return dict(self._failures)

    # -- one capture ---------------------------------------------------------------------------------
    def _post(self, path: str, body: dict[str, Any] | None, timeout_s: float) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(self.config.base_url.rstrip("/") + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s):  # noqa: S310 (the operator's URL)
            pass

    def _wait(self, seconds: float) -> bool:
        """Sleep one poll interval (or less); False once the agent is closing."""
        return not self._closing.wait(max(0.0, min(self._poll_s, seconds)))

    def _run(self, capture_id: int, steps: int, analyse: bool) -> None:
        try:
            self._capture(capture_id, steps, analyse)
        except Exception as exc:  # noqa: BLE001 (a bug here must end the capture, not wedge every later one)
            self._fail("unreadable", f"the capture could not be analysed ({type(exc).__name__}: {exc})", {})

    def _capture(self, capture_id: int, steps: int, analyse: bool = True) -> None:
        """One capture (the module docstring's steps); analyse False: a flight-recorder window, which
        waits at most WINDOW_STEP_WAIT_S for its steps (an idle vLLM must not hold the recorder)."""
        cfg = self.config
        directory = Path(cfg.profiler_dir)
        prefix = f"infersight-{capture_id}-{secrets.token_hex(4)}"  # unique across agents and restarts
        before = set(trace_files(directory))
        # start_mono_ns: when /start_profile was sent, on the clock of the probe rings' STEP records
        # (CLOCK_MONOTONIC): the flight recorder charges the window from the step that ends after it.
        info: dict[str, Any] = {"steps_requested": steps, "profile_prefix": prefix,
                                "start_mono_ns": time.monotonic_ns()}
        try:
            self._post("/start_profile", {"profile_prefix": prefix, "max_iterations": steps}, cfg.http_timeout_s)
            info["start_call_s"] = round((time.monotonic_ns() - info["start_mono_ns"]) / 1e9, 4)
        except (urllib.error.URLError, OSError) as exc:
            return self._fail("profiler_http", f"{cfg.base_url}/start_profile failed ({exc}): was vLLM started "
                              "with --profiler-config '{\"profiler\": \"torch\", \"torch_profiler_dir\": ...}'?",
                              info)
        # vLLM's worker stops itself after N steps (max_iterations) and writes its trace then: its
        # appearance ends the wait. The scraped count is only a fallback for a vLLM that ignores
        # max_iterations, with a wide margin: it lags the worker and, on a loaded host, catches up in
        # bursts, so stopping on it near N sent /stop_profile before any step was profiled.
        # A window polls the directory every WINDOW_POLL_S (its trace's appearance bounds the steps it
        # is charged: agent.recorder.vllm_windows), the scraped count every poll_s as for a capture.
        self._poll_s = cfg.poll_s if analyse else min(cfg.poll_s, WINDOW_POLL_S)
        start_count = self.steps()
        started = scraped = time.monotonic()
        deadline = started + (cfg.step_wait_s if analyse else min(cfg.step_wait_s, WINDOW_STEP_WAIT_S))
        counted = 0.0
        while time.monotonic() < deadline:
            if set(trace_files(directory)) - before:
                break
            if time.monotonic() - scraped >= cfg.poll_s:
                scraped, now_count = time.monotonic(), self.steps()
                if start_count is None:
                    start_count = now_count
                elif now_count is not None:
                    counted = now_count - start_count
            if counted >= 4 * steps + 16 or not self._wait(deadline - time.monotonic()):
                break
        info.update(steps_counted=int(counted), window_s=round(time.monotonic() - started, 3))
        stop_at = time.monotonic()
        try:
            self._post("/stop_profile", None, max(cfg.http_timeout_s, cfg.trace_wait_s))
        except (urllib.error.URLError, OSError) as exc:
            return self._fail("profiler_http", f"{cfg.base_url}/stop_profile failed ({exc})", info)
        info["stop_call_s"] = round(time.monotonic() - stop_at, 4)
        self._pick_up(directory, before, prefix, info, analyze_vllm_trace if analyse else complete_trace)

    def _pick_up(self, directory: Path, before: set[str], prefix: str, info: dict[str, Any],
                 analyse: Callable[[str], dict[str, Any]] = analyze_vllm_trace) -> None:
        """Wait for the new worker trace to be complete, then analyse it (steps 5 and 6)."""
        deadline = time.monotonic() + self.config.trace_wait_s
        sizes: dict[str, int] = {}
        failed_at: dict[str, int] = {}  # name -> the size at which it did not parse
        last_error = ""
        while True:
            now = trace_files(directory)
            name = pick_worker_trace(sorted(set(now) - before), prefix)
            if name is not None and sizes.get(name) == now[name] != failed_at.get(name):  # unchanged: try it
                path = str(directory / name)
                try:
                    report = analyse(path)
                except TraceError as exc:
                    last_error, failed_at[name] = str(exc), now[name]  # tried again only if it grows
                else:
                    info["trace_bytes"], info["trace_ready_mono_ns"] = now[name], time.monotonic_ns()
                    if now[name] > LARGE_TRACE_BYTES:
                        info["note"] = "a large trace: start vLLM with torch_profiler_with_stack false"
                    report["capture"] = info
                    return self._finish(CaptureOutcome("done", path, report))
            sizes = now
            if time.monotonic() >= deadline or not self._wait(deadline - time.monotonic()):
                break
        if last_error:
            return self._fail("unreadable", f"the worker trace did not parse: {last_error}", info)
        if self._closing.is_set():
            return self._fail("no_trace", "the agent stopped before vLLM's worker trace appeared", info)
        return self._fail("no_trace", f"no worker trace (*.pt.trace.json.gz) appeared in {directory} within "
                          f"{self.config.trace_wait_s:g} s after /stop_profile: is it vLLM's torch_profiler_dir "
                          "as this host sees it?", info)

    def _fail(self, reason: str, message: str, info: dict[str, Any]) -> None:
        log.warning("vLLM capture failed (%s): %s", reason, message)
        with self._lock:
            self._failures[reason] = self._failures.get(reason, 0) + 1
        self._finish(CaptureOutcome("failed", "", {"error": message, "reason": reason, "capture": info}))

    def _finish(self, outcome: CaptureOutcome) -> None:
        with self._lock:
            self._outcome = outcome


class _FailureCounts(Collector):
    def __init__(self, target: VllmProfilerTarget) -> None:
        self.target = target

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(C.CAPTURE_FAILURES.name, C.CAPTURE_FAILURES.help,
                                  labels=list(C.CAPTURE_FAILURES.labels))
        for reason, n in sorted(self.target.failures().items()):
            fam.add_metric([reason], n)
        yield fam
