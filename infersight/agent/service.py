"""The agent process: an ingest loop on the main thread, the HTTP server on a background thread.

The engine never waits on any of this: it only writes to its ring, which drops (and counts)
when the agent falls behind.

A finished capture's analysis is agent.capture_analysis's, the listener socket agent.api.listen_socket's
(both names re-exported here).
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from infersight.agent.autoapply.part import attach_autoapply
from infersight.agent.autoapply.routes import decisions_document
from infersight.agent.capture.controller import (
    CaptureController, CaptureRecord, default_token_file, load_or_create_token,
)
from infersight.agent.capture.analysis import analyze_capture
from infersight.agent.component import AgentComponent
from infersight.agent.config import AgentConfig, ConfigError
from infersight.agent.rings.engine_scope import RingEngine
from infersight.agent.eviction_log import EvictionLog
from infersight.agent.rings.ingest import AttachedRing, RingSet
from infersight.agent.api.listen_socket import PortInUseError, bind_listener
from infersight.agent.parts import (
    CapturesPart, CollectorOnly, GpuPart, ParquetPart, RecorderPart, RingStatsPart, TracingPart, VllmKvPart,
)
from infersight.agent.poll_guard import PollGuard
from infersight.agent.poll_timer import PollTimer
from infersight.agent.api.server import build_app, listener_options
from infersight.agent.state import AgentState
from infersight.probes.ring_lease import lease_refusal
from infersight.correlate.frames import EventFrames
from infersight.exporters.discovery import DiscoveryCollector
from infersight.exporters.prometheus import build_registry
from infersight.gpu import GpuCollector, GpuSampler, open_collector
from infersight.gpu.frames import covering_samples
from infersight.gpu.selection import GpuSelection
from infersight.tracing.identity import identity_resource, resource_attributes

if TYPE_CHECKING:
    import pandas as pd

    from infersight.tracing.hook import TracingHook

__all__ = ["Agent", "PortInUseError", "analyze_capture"]  # the last two live in capture_analysis, listen_socket

log = logging.getLogger("infersight.agent")


class Agent:
    """The poll loop over the agent's parts (agent.component): the list is built here, once, in the
    order the poll runs them; each part got what it needs in its constructor."""

    def __init__(self, config: AgentConfig, gpu_collector: GpuCollector | None = None) -> None:
        """gpu_collector: the GPU telemetry source (None: picked by open_collector from the config)."""
        self.config = config
        for name in config.rings:  # one reader per ring: a second agent on a named ring is a usage error
            refusal = lease_refusal(name)
            if refusal is not None:
                raise ConfigError(refusal)
        self.tracing: TracingHook | None = None  # built below when asked; finished rows go to it
        self.state = AgentState(config, on_rows=self._on_rows)
        self.rings = RingSet(config.rings, config.discover, config.retry_interval_s,
                             config.discover_prefix, config.limits)

        self.sink = self.frame_sink = None
        if config.parquet_dir:
            from infersight.exporters.parquet import FrameSink, ParquetSink  # load pyarrow only when asked

            self.sink = ParquetSink(Path(config.parquet_dir) / "requests.parquet")
            self.frame_sink = FrameSink(Path(config.parquet_dir) / "events")
        self._sock = bind_listener(config.host, config.port)  # first: a busy port is a usage error, before any work
        self.port = self._sock.getsockname()[1]
        self.resource = identity_resource(config.identity)  # who we are: on target_info, spans and OTLP metrics
        who = resource_attributes(self.resource)
        # A node's dcgm-exporter: the series of the engines' GPUs (their GPU records) and of our pod only.
        self.gpu_selection = GpuSelection(str(who.get("k8s.pod.name", "")), str(who.get("k8s.namespace.name", "")))
        gpu_config = config.gpu.telemetry()
        self.gpu = GpuSampler(gpu_collector or open_collector(gpu_config, selection=self.gpu_selection),
                              gpu_config.interval_s, gpu_config.ring_size)
        log.info("GPU telemetry: %s", self.gpu.status_line())
        log.info("retention: finished requests' rows up to %g MiB of row data (--retention-mib), the oldest first out",
                 config.retention.rows_bytes / (1 << 20))
        self.registry = build_registry(self.state, self.gpu, who)
        self.registry.register(DiscoveryCollector(self.rings.discovery))  # rings held by another agent
        self.poll_guard = PollGuard()  # a source that raises in a poll is counted, not the agent's end
        self.registry.register(self.poll_guard.collector())
        self.poll_timer = PollTimer()  # the agent's own cost per poll
        self.registry.register(self.poll_timer.collector())
        self._rings_read_s = time.monotonic()  # when the rings were last read (set again at each read)
        # The parts, in poll order. Each one's collector is registered as it is added, so /metrics keeps
        # the order it always had (the API listener's connection gate, registered with the server
        # below, sits between the flight recorder's families and tracing's).
        parts: list[AgentComponent] = []

        def add(part: AgentComponent) -> None:
            parts.append(part)
            collector = part.collector()
            if collector is not None:
                self.registry.register(collector)

        # -- an engine's own /metrics (opt-in: --vllm-url): served under our names where no ring provides them
        self.vllm_metrics = None
        if config.vllm_server.enabled:
            from prometheus_client import CollectorRegistry

            from infersight.exporters.scraped_view import MergedCollector
            from infersight.sources.vllm.scraper import VllmMetricsScraper

            self.vllm_metrics = VllmMetricsScraper(config.vllm_server.url, config.vllm_server.metrics_interval_s,
                                                   timeout_s=min(2.0, config.vllm_server.metrics_interval_s))
            own, self.registry = self.registry, CollectorRegistry(auto_describe=False)
            self.registry.register(MergedCollector(own, self.vllm_metrics.latest,
                                                   config.exposition.model_name))
            add(CollectorOnly("vllm_metrics", self.vllm_metrics.collector()))
        target = None
        if self.vllm_metrics is not None and config.vllm_server.profiler_dir:  # captures through vLLM's profiler
            from infersight.sources.vllm.profiler import VllmProfilerConfig, VllmProfilerTarget

            target = VllmProfilerTarget(VllmProfilerConfig(config.vllm_server.url, config.vllm_server.profiler_dir,
                                                           config.vllm_server.capture_wait_s,
                                                           config.vllm_server.capture_wait_s),
                                        self.vllm_metrics.step_count)
        self.captures = CaptureController(config.captures.min_interval_s, config.captures.rules(), target=target)
        add(CapturesPart(self.captures, self.state, self._ring_names,
                                  target.collector() if target is not None else None))
        self.recorder = None  # the flight recorder (opt-in: --flight-recorder): sampled kernel windows
        if config.flight_recorder is not None:
            from infersight.agent.recorder.flight_recorder import FlightRecorder
            from infersight.exporters.recorder import RecorderCollector

            self.recorder = FlightRecorder(config.flight_recorder, self.state, self.captures,
                                           self.state.slow_rule.slos)
            add(RecorderPart(self.recorder, self._ring_names, lambda: self._rings_read_s,
                                      RecorderCollector(self.recorder)))
        token_file = Path(config.captures.token_file) if config.captures.token_file else default_token_file(self.port)
        self.token = config.captures.token or load_or_create_token(token_file,
                                                                   private_dir=not config.captures.token_file)
        self.token_file = None if config.captures.token else token_file
        if self.token_file is not None:
            log.info("capture token (bearer for POST /api/v1/capture): %s", self.token_file)
        self.evictions = EvictionLog()  # who evicted whom, for /api/v1/kv/evictions
        add(self.evictions)
        self._server = uvicorn.Server(uvicorn.Config(build_app(self.state, self.registry, self, evictions=self.evictions,
                                                               decisions=self.decisions_document),
                                                     log_level="warning",
                                                     access_log=False, **listener_options(config.max_connections, self.registry)))
        self._stop = threading.Event()
        self._stop_at: float | None = None
        self._http: threading.Thread | None = None
        # -- tracing (opt-in): spans and OTLP metrics built from the probe events --------------------
        if config.tracing.otlp_endpoint is not None:
            from infersight.tracing.hook import TracingHook  # load the OpenTelemetry SDK only when asked

            interval_ns = int(gpu_config.interval_s * 1e9)
            try:
                self.tracing = TracingHook.from_config(
                    config.tracing, config.exposition.model_name, self.state.counters, kernels_for_request=self.state.kernel_by_request.get,
                    gpu_for_step=lambda start, end: covering_samples(self.gpu.recent(), start, end, interval_ns),
                    resource=self.resource)
            except ValueError as exc:  # e.g. grpc asked for but not installed
                raise ConfigError(str(exc)) from None
            add(TracingPart(self.tracing, self.state))
        # -- OTLP receiver (opt-in): an engine's own spans, joined with the rows by the tracing hook ----
        self.otlp_receiver = None
        if self.tracing is not None and config.tracing.receiver_on:
            from infersight.tracing.receiver import OtlpReceiver

            try:
                self.otlp_receiver = OtlpReceiver.attach(config.tracing, self.tracing, config.max_connections)
            except ValueError as exc:  # a busy or malformed address, grpcio missing
                raise ConfigError(str(exc)) from None
            add(CollectorOnly("tracing", self.otlp_receiver.collector()))
        # -- vLLM's KV cache events (opt-in): translated into the kv_events frame each poll ----------
        self.vllm_kv = None
        if config.vllm_kv.enabled:
            from infersight.sources.vllm.kv_events import VllmKVSubscriber  # zmq when asked
            from infersight.sources.vllm.kv_metrics import VllmKVCollector

            try:
                self.vllm_kv = VllmKVSubscriber(config.vllm_kv.subscriber(),
                                                wall_anchor=lambda: self.state.wall_anchor)
            except ValueError as exc:  # the endpoint is busy or not an address of this host
                raise ConfigError(str(exc)) from None
            add(VllmKvPart(self.vllm_kv, self.state, VllmKVCollector(self.vllm_kv),
                                    self.frame_sink.write if self.frame_sink is not None else None))
        # -- the closed loop (opt-in: --auto-apply): advice applied behind a canary (agent.autoapply) ----
        self.autoapply = attach_autoapply(config.auto_apply, self.state, self._ring_names,
                                          self.tracing.pipeline.provider if self.tracing is not None else None)
        if self.autoapply is not None:
            add(self.autoapply)
        self._gpu_part = GpuPart(self.gpu, self.state, self.captures.in_progress,
                                 self.frame_sink.write_table if self.frame_sink is not None else None,
                                 self.gpu_selection, self.rings.gpu_uuids)
        for part in (self._gpu_part, RingStatsPart(self.rings, self.state),
                     ParquetPart(self.state, self.sink, self.frame_sink)):
            add(part)
        self.parts: tuple[AgentComponent, ...] = tuple(parts)

    def decisions_document(self, limit: int) -> dict[str, Any]:
        """GET /api/v1/decisions (agent.autoapply.routes)."""
        return decisions_document(self.autoapply, self.state, self.config.auto_apply, self._ring_names(),
                                  self.config.vllm_server.url, limit)

    def _on_rows(self, rows: pd.DataFrame, events: pd.DataFrame) -> None:
        """AgentState's finished rows (under its lock): to the tracing hook, when there is one."""
        if self.tracing is not None:
            self.tracing.add_rows(rows, events)

    def _ring_names(self) -> list[str]:
        return sorted(self.rings.attached)

    def start_http(self) -> None:
        self.gpu.start()
        self._http = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                      name="infersight-http")
        self._http.start()
        log.info("serving on http://%s:%d (/metrics, /api/v1/summary)", self.config.host, self.port)
        if self.otlp_receiver is not None:
            self.otlp_receiver.start()
        if self.vllm_metrics is not None:
            self.vllm_metrics.start()

    def poll_once(self) -> int:
        """Read every source once and fold what it had in; returns how many rings had data. Each part's
        hook runs confined (agent.poll_guard): one that raises is counted under the part's name and
        logged once per kind, and the poll goes on with the next."""
        guard, start = self.poll_guard, time.perf_counter()
        for part in self.parts:  # the GPU's readings first: the steps read below are measured against them
            guard.run(part.name, part.start_poll)
        batches = guard.run("rings", self._read_rings) or []
        for ring, frames in batches:  # each ring on its own: one ring's bad batch leaves the others theirs
            guard.run("rings", self._ingest_ring, ring, frames)
        for part in self.parts:
            guard.run(part.name, part.end_poll, bool(batches))
        self.poll_timer.observe(time.perf_counter() - start)
        return len(batches)

    def _read_rings(self) -> list[tuple[AttachedRing, EventFrames]]:
        self.rings.refresh()
        self._rings_read_s = time.monotonic()  # the flight recorder judges vLLM's idleness at the read
        batches = self.rings.read()
        self.state.note_rings({ring.name: ring.engine for ring in self.rings.attached.values()})
        self.state.count_rejected(self.rings.screen.take_rejected())
        return batches

    def _ingest_ring(self, ring: AttachedRing, frames: EventFrames) -> None:
        self.state.ingest(frames, RingEngine(ring.index, ring.name, ring.engine))  # the engine label's scope
        anchor = ring.consumer.anchor
        for part in self.parts:
            part.on_frames(frames, ring.index, anchor)
        ring.consumer.commit()  # delivered: were we killed now, a successor would not count it lost

    @property
    def capture_records(self) -> list[CaptureRecord]:
        return self.captures.records

    def request_capture(self, steps: int, tool: str, reason: str = "api", decode: str | None = None) -> CaptureRecord:
        """decode: "eager" | "graphs" | None (the tool's default): probes.control.CaptureDecode."""
        record = self.captures.request(self._ring_names(), steps, tool, reason, decode=decode)
        self._gpu_part.pause_profiling()
        return record

    def run(self, duration_s: float | None = None) -> None:
        self.start_http()
        deadline = time.monotonic() + duration_s if duration_s else None
        try:
            while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                start = time.monotonic()
                self.poll_once()
                self._stop.wait(max(0.0, self.config.poll_interval_s - (time.monotonic() - start)))
        finally:
            self.close()

    def stop(self) -> None:
        if self._stop_at is None:
            self._stop_at = time.monotonic()  # the shutdown deadlines count from here (a signal, usually)
            if self.tracing is not None:  # a poll in progress stops building spans at half the shutdown time
                self.tracing.build_deadline = self._stop_at + self.config.tracing.otlp_shutdown_timeout_s / 2
        self._stop.set()

    def close(self) -> None:
        if self._stop_at is None:
            self.stop()
        stop_at = self._stop_at if self._stop_at is not None else time.monotonic()
        if self.otlp_receiver is not None:
            self.otlp_receiver.stop()  # no new spans: what came is joined or forwarded by tracing.close
        # One last GPU reading after the engine's last step, so the energy account covers the whole run.
        self.gpu.stop(final_poll=True)
        self.poll_once()
        self.state.close_energy()
        if self.sink is not None:
            self.sink.write(self.state.take_new_rows())
        if self.tracing is not None:
            # within otlp_shutdown_timeout_s of the stop; what it could not send is counted
            self.tracing.close(max(0.2, stop_at + self.config.tracing.otlp_shutdown_timeout_s - time.monotonic()))
            stats = self.tracing.export_stats()
            self.state.set_source_stats("otlp_export", stats)
            log.info("OTLP export at exit: %d spans queued, %d exported, %d unsent at shutdown, dropped %s",
                     stats["spans_queued"], stats["spans_exported"], stats["unsent_at_shutdown"], stats["dropped"])
        if self.sink is not None:
            self.sink.close()
        if self.frame_sink is not None:
            self.frame_sink.close()
        self._server.should_exit = True
        if self._http is not None:
            self._http.join(timeout=5)
        self.captures.close()
        if self.autoapply is not None:
            self.autoapply.close()
        self.gpu.stop()
        self.rings.close()
        if self.vllm_kv is not None:
            self.vllm_kv.close()
        if self.vllm_metrics is not None:
            self.vllm_metrics.stop()
        self._sock.close()
