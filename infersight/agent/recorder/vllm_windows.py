"""The flight recorder on a real vLLM: its windows go through vLLM's profiler endpoints
(`--vllm-url` with `--vllm-profiler-dir`), their cost is measured on the STEP records that
infersight's stat-logger plugin writes for every vLLM engine step (the ring
`infersight-vllm-<api-server pid>`), exactly as on our engine.

A window (sources.vllm.profiler.VllmProfilerTarget.start_window): POST /start_profile
{"max_iterations": N}. vLLM's worker profiler (vllm/profiler/wrapper.py, 0.32) counts its own
steps and stops itself at the step() call after the N-th: it then writes the trace (and, on a
CPU-only worker, builds and prints a key_averages table) inside that engine step. The agent
waits for that trace to appear (at most 5 s: an idle vLLM takes no steps), sends /stop_profile
(which then only ends the API server's own profiler, unless vLLM runs with "ignore_frontend":
true, recommended: that profiler records the whole session and /stop_profile once took 6.3 s
writing it) and reads the trace. vLLM 0.32 also offers "delay_iterations" (steps to skip first)
and a warm-up/active schedule; a window needs neither.

Which STEP records a window is charged (`VllmWindows.first_step`, `steps_until`): from the first
step that ended after /start_profile was sent (the profiler's start runs inside vLLM's engine-core
loop, between two steps, so it lengthens that step's start-to-end period) through the first step
that ended after the agent saw the worker's trace complete (polled every 20 ms), at least N +
EXTRA_STEPS and at most MAX_LATE_STEPS more. Measured on a loaded 2-core host, the stall of the
trace export showed up anywhere from 1 to 9 steps after the first (the plugin stamps steps as
their outputs reach the API server, in bursts there), so a fixed N + 1 missed it in some windows.
The recorder then adds its after-steps and measures with agent.recorder.budget.window_cost.

The trace (`analyze_vllm_window`): vLLM's step ranges (`execute_context_..._generation_...`) are
given the `step` and `forward.<phase>` ranges the kernel analysis reads (vllm_trace.
with_step_ranges); a CPU build's trace has no GPU activity, so its activities are the CPU ops'
exclusive segments (kernels.analysis.cpu_trace) with the same categories (GEMM = oneDNN / aten::linear ...).
vLLM records no shapes for it, so a vLLM window has no roofline. What lands in "other" on the CPU
build (one 4-step decode window of the tiny Llama, 2026-12-01: other 43% of op time): the compiled
graph's own exclusive time, `## Call CompiledFxGraph ##` (18%: Inductor's fused C++ kernels, the
norms, activations and residual adds, emit no cpu_op events of their own), the KV-cache write
`vllm::unified_kv_cache_update` (7.5%) and view ops (aten::slice / as_strided / view / split /
narrow / chunk, 10%). GEMM (oneDNN linear) was 35%, attention-decode 15%.

Without the plugin's ring the agent sees vLLM's steps only as a scraped counter, with no step
timing to measure a window against: the recorder then starts no window (it needs STEP records).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from infersight.agent.capture.controller import CaptureRecord
from infersight.agent.recorder.window import window_trace
from infersight.correlate.kernel_windows import WindowSummary, summarize_window
from infersight.kernels.analysis.categories import classify
from infersight.kernels.frames import empty_frame
from infersight.kernels.readers.kineto import read_json_document
from infersight.kernels.ceilings.ceiling_lookup import CeilingLookup, CeilingQuery
from infersight.kernels.analysis.roofline import ROOFLINE_COLUMNS
from infersight.kernels.readers.shapes import engine_step_ids
from infersight.sources.vllm.trace import with_step_ranges

#: Steps charged beyond the window's N (module docstring).
EXTRA_STEPS = 1
#: At most this many steps are charged past N + EXTRA_STEPS: an agent that saw the trace late (its
#: thread starved: once 11.7 s after the start, the trace written at 0.9 s; /stop_profile once took
#: 3.3 s before the trace was read) must not charge the window seconds of ordinary steps. (The steps
#: stay in the recorder's history however late: agent.recorder.flight_recorder pins them.)
MAX_LATE_STEPS = 128
#: No STEP record for this long: vLLM is idle.
IDLE_S = 2.0


def analyze_vllm_window(path: str | Path, first_step: int, ceilings: CeilingQuery = CeilingQuery()
                        ) -> tuple[WindowSummary, CeilingLookup | None]:
    """A vLLM worker trace read into the window's summary (steps numbered from first_step), and no
    ceilings: with no shapes there is no roofline to place (`ceilings` is unused; the signature is
    agent.recorder.window.analyze_window's). TraceError when it cannot be read."""
    doc, _ = with_step_ranges(read_json_document(path))
    trace, kind = window_trace(doc, path)
    classified = engine_step_ids(classify(trace.kernels), trace.ranges, first_step)
    return summarize_window(classified, empty_frame(ROOFLINE_COLUMNS), kind), None


class VllmWindows:
    """How the recorder reads the windows and captures of one vLLM capture target (name: the
    target's, which its records carry as `ring`)."""

    def __init__(self, target_name: str) -> None:
        self.name = target_name

    def owns(self, record: CaptureRecord) -> bool:
        return record.ring == self.name

    @staticmethod
    def first_step(history: pd.DataFrame, record: CaptureRecord) -> int:
        """The id of the first STEP record that ended after the record's /start_profile was sent;
        the next id to come when none has yet; -1 when the record says nothing of its start (it
        failed before) or when every step kept ended after it (the steps around the start have left
        the history: the oldest kept is not the first one): its cost is then only estimated."""
        started = ((record.analysis or {}).get("capture") or {}).get("start_mono_ns")
        if started is None:
            return -1
        if history.empty:
            return 0
        ends = history["end_ns"].to_numpy(np.int64)
        ids = history["step_id"].to_numpy(np.int64)
        after = ids[ends > int(started)]
        if len(after) == len(ids):
            return -1
        return int(after.min()) if len(after) else int(ids.max()) + 1

    analyze = staticmethod(analyze_vllm_window)

    @staticmethod
    def stepping(history: pd.DataFrame, now_s: float) -> bool:
        """Whether vLLM took a step within IDLE_S before now_s (time.monotonic(): when the ring was last
        read, not the end of the poll, which on a loaded host comes seconds later): an idle vLLM takes
        none, so its last STEP record still looks busy (a window then would wait for steps in vain)."""
        return not history.empty and now_s - int(history["end_ns"].max()) / 1e9 < IDLE_S

    @staticmethod
    def charged_steps(record: CaptureRecord) -> int:
        """Steps charged before the trace is known to be written (at least N + EXTRA_STEPS)."""
        return record.steps + EXTRA_STEPS

    @staticmethod
    def charge_until_ns(record: CaptureRecord) -> int | None:
        """When the agent saw the worker's trace complete (CLOCK_MONOTONIC ns), None when it never did."""
        return ((record.analysis or {}).get("capture") or {}).get("trace_ready_mono_ns")

    @staticmethod
    def steps_until(history: pd.DataFrame, first_step: int, until_ns: int, at_least: int) -> int | None:
        """Steps from first_step through the first one that ended after until_ns (the trace written:
        where in those steps vLLM's stall lands varies, from the step after the start call to several
        steps past the N-th), at least at_least; None until that step has arrived."""
        later = history["step_id"].to_numpy(np.int64)[history["end_ns"].to_numpy(np.int64) > until_ns]
        if len(later) == 0:
            return None
        return min(max(at_least, int(later.min()) - first_step + 1), at_least + MAX_LATE_STEPS)

    @staticmethod
    def timings(record: CaptureRecord) -> dict[str, float]:
        """What the profiler calls took (s), the trace's size and when (CLOCK_MONOTONIC ns) the window was
        asked for and its trace was read, for the window's stored entry."""
        info = (record.analysis or {}).get("capture") or {}
        keys = ("start_call_s", "stop_call_s", "window_s", "trace_bytes", "start_mono_ns", "trace_ready_mono_ns")
        return {k: info[k] for k in keys if k in info}
