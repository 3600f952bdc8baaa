"""The agent's parts, each an AgentComponent (agent.component): built once in Agent.__init__ with
what it needs, then driven by the poll loop. Listed in the order the agent runs them (see there).

Heavy dependencies (pyarrow, OpenTelemetry, ZeroMQ) are imported by the agent only when a part is
asked for; here they appear as types only, and collectors that would import them are handed in.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

from prometheus_client.registry import Collector

from infersight.agent.capture.controller import CaptureController, CaptureRecord
from infersight.agent.capture.analysis import analyze_capture
from infersight.agent.component import Component
from infersight.agent.state import AgentState
from infersight.correlate.frames import EventFrames
from infersight.gpu import GpuSampler, phase_breakdown, samples_frame
from infersight.gpu.selection import GpuSelection

if TYPE_CHECKING:
    import pandas as pd

    from infersight.agent.rings.ingest import RingSet
    from infersight.agent.recorder.flight_recorder import FlightRecorder
    from infersight.exporters.parquet import FrameSink, ParquetSink
    from infersight.sources.vllm.kv_events import VllmKVSubscriber
    from infersight.tracing.hook import TracingHook

log = logging.getLogger("infersight.agent")


class CollectorOnly(Component):
    """A part that only adds to /metrics (the vLLM scraper's families, the OTLP receiver's counts)."""

    def __init__(self, name: str, collector: Collector) -> None:
        self.name, self._collector = name, collector

    def collector(self) -> Collector | None:
        return self._collector


class CapturesPart(Component):
    """Captures asked for or due by rule: finished ones analysed, the auto-capture rules checked."""

    name = "captures"

    def __init__(self, captures: CaptureController, state: AgentState, rings: Callable[[], list[str]],
                 target_collector: Collector | None = None) -> None:
        """target_collector: the capture target's counts (vLLM's profiler), when captures go there."""
        self.captures, self.state, self.rings, self._collector = captures, state, rings, target_collector

    def end_poll(self, had_batches: bool) -> None:
        for record in self.captures.poll():
            log.info("capture %d %s: %s", record.capture_id, record.state, record.path or "-")
            if record.state == "done" and record.path and record.analysis is None:  # a target may analyse its own
                first_step = self.captures.first_step(record)
                record.analysis, per_request = analyze_capture(record.path, self.state.recent_batch_frame(),
                                                               first_step, self.state.recent_steps_frame())
                self.state.add_kernel_summaries(per_request)
        last = self.state.last_step
        kv_usage = last["kv_blocks_in_use"] / last["kv_blocks_total"] if last.get("kv_blocks_total") else None
        preempted = int(last.get("preempted", 0)) if last else 0
        self.captures.check_rules(self.rings(), self.state.recent_ttft_p99(), kv_usage, preempted)

    def collector(self) -> Collector | None:
        return self._collector


class RecorderPart(Component):
    """The flight recorder: every batch's steps (a window's cost is measured on them), then its poll.
    Runs in the captures' step of the poll (its windows are captures)."""

    name = "captures"

    def __init__(self, recorder: FlightRecorder, rings: Callable[[], list[str]], read_s: Callable[[], float],
                 collector: Collector) -> None:
        """read_s: when the rings were last read (the recorder judges vLLM's idleness at the read)."""
        self.recorder, self.rings, self.read_s, self._collector = recorder, rings, read_s, collector

    def on_frames(self, frames: EventFrames, ring_index: int, anchor: tuple[int, int]) -> None:
        self.recorder.add_steps(frames.steps)

    def end_poll(self, had_batches: bool) -> None:
        self.recorder.poll(self.rings(), read_s=self.read_s())

    def collector(self) -> Collector | None:
        return self._collector


class TracingPart(Component):
    """Spans from the probe events: every batch into the hook, which builds what is ready; when no
    ring had data, rows still waiting for their steps time out all the same."""

    name = "tracing"

    def __init__(self, hook: TracingHook, state: AgentState) -> None:
        self.hook, self.state = hook, state

    def on_frames(self, frames: EventFrames, ring_index: int, anchor: tuple[int, int]) -> None:
        self.hook.ingest(frames, ring_index, anchor)

    def end_poll(self, had_batches: bool) -> None:
        if not had_batches:
            self.hook.process()
        self.state.set_source_stats("otlp_export", self.hook.export_stats())

    def collector(self) -> Collector | None:
        return self.hook.collector()


class VllmKvPart(Component):
    """vLLM's KV cache events: each poll's messages folded into the state (inside the subscriber's
    poll, so its batch counts and these folds become visible together) and, with --parquet-dir,
    written as the kv_events frame."""

    name = "vllm_kv_events"

    def __init__(self, subscriber: VllmKVSubscriber, state: AgentState, collector: Collector,
                 write_frames: Callable[[EventFrames], None] | None = None) -> None:
        self.subscriber, self.state, self._collector, self.write_frames = subscriber, state, collector, write_frames

    def end_poll(self, had_batches: bool) -> None:
        self.state.set_source_stats("vllm_kv_events", self.subscriber.stats())
        kv_frames = EventFrames(kv_events=self.subscriber.poll(deliver=self._fold))
        if not kv_frames.kv_events.empty and self.write_frames is not None:
            self.write_frames(kv_frames)

    def _fold(self, rows: pd.DataFrame) -> None:
        if not rows.empty:
            self.state.ingest(EventFrames(kv_events=rows))

    def collector(self) -> Collector | None:
        return self._collector


class GpuPart(Component):
    """GPU telemetry: the sampler's readings into the energy account first (the steps read next are
    measured against them); at the end of the poll, profiling counters paused while a capture runs,
    and the summary's GPU block refreshed about once a second."""

    name = "gpu"

    def __init__(self, sampler: GpuSampler, state: AgentState, active_captures: Callable[[], list[CaptureRecord]],
                 write_table: Callable[[str, pd.DataFrame], None] | None = None,
                 selection: GpuSelection | None = None,
                 engine_gpus: Callable[[], frozenset[str]] | None = None) -> None:
        """active_captures: the captures asked for or running (and the recorder's window).
        write_table: events/gpu.parquet's writer, with --parquet-dir (the report's GPU figure).
        selection, engine_gpus: the collector's selection of the node's GPUs, kept up to date at
        each poll with the UUIDs the engines reported (their GPU records)."""
        self.sampler, self.state, self.active_captures, self.write_table = sampler, state, active_captures, write_table
        self.selection, self.engine_gpus = selection, engine_gpus
        self._written_ns = -1  # readings up to here are written
        self._summary_at = 0.0

    def start_poll(self) -> None:
        if self.selection is not None and self.engine_gpus is not None:
            self.selection.set_uuids(self.engine_gpus())
        readings = self.sampler.recent()
        self.state.add_gpu_samples(readings)
        if self.write_table is not None:
            new = [r for r in readings if r.ts_ns > self._written_ns]
            if new:
                self.write_table("gpu", samples_frame(new))
                self._written_ns = max(r.ts_ns for r in new)

    def end_poll(self, had_batches: bool) -> None:
        self.pause_profiling()
        self._summary()

    def pause_profiling(self) -> None:
        """GPU profiling counters (GPM, DCGM profiling fields) are paused while any capture is
        asked for or running, so Nsight tools and the profiler own the performance monitors."""
        active = self.active_captures()
        self.sampler.pause_profiling(bool(active))
        for record in active:
            record.gpu_profiling = self.sampler.pause_note or "paused"

    def _summary(self) -> None:
        now = time.monotonic()
        if now - self._summary_at < 1.0:
            return
        self._summary_at = now
        readings = self.sampler.recent()
        # No readings (no GPU, or none yet): no phase has a sample, and phase_breakdown would say
        # so from two empty frames it costs ms to build.
        phases = (phase_breakdown(samples_frame(readings), self.state.recent_steps_frame()).to_dict("records")
                  if readings else [])
        self.state.set_gpu_summary(self.sampler.status_line(), phases)


class RingStatsPart(Component):
    """The rings' counts (produced, delivered, dropped, lost) and the wall-clock anchor, for the summary;
    whether the engines reported GPUs."""

    name = "rings"

    def __init__(self, rings: RingSet, state: AgentState) -> None:
        self.rings, self.state = rings, state

    def end_poll(self, had_batches: bool) -> None:
        anchor = next((r.consumer.anchor for r in self.rings.attached.values()), None)
        self.state.set_ring_stats(self.rings.stats(), anchor)
        # An engine that reported GPUs (its GPU records) runs on them: the speculation interval's CUDA term.
        self.state.engine_on_gpu = bool(self.rings.gpu_uuids())


class ParquetPart(Component):
    """With --parquet-dir: every batch's frames to events/*.parquet, the new request rows to
    requests.parquet. Without: the new rows are dropped (kept for the sink only, they must not pile up)."""

    name = "parquet"

    def __init__(self, state: AgentState, sink: ParquetSink | None, frame_sink: FrameSink | None) -> None:
        self.state, self.sink, self.frame_sink = state, sink, frame_sink

    def on_frames(self, frames: EventFrames, ring_index: int, anchor: tuple[int, int]) -> None:
        if self.frame_sink is not None:
            self.frame_sink.write(frames)

    def end_poll(self, had_batches: bool) -> None:
        if self.sink is not None:
            self.sink.write(self.state.take_new_rows())
        else:
            self.state.drop_new_rows()
