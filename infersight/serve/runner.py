"""Wiring for `infersight serve`: the engine with probes (its own process, or a thread here), uvicorn, and the agent."""
from __future__ import annotations

import logging
import signal

import uvicorn

from infersight.http.connections import ConnectionGate
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime.config import EngineConfig
from infersight.runtime.engine.engine import Engine
from infersight.serve.api_error import openai_error_body
from infersight.serve.app import build_app
from infersight.serve.config import ServeConfig
from infersight.serve.engine_client import EngineClient
from infersight.serve.engine_handle import EngineHandle
from infersight.serve.engine_loop import EngineLoop
from infersight.serve.probe_records import ProbeWriter
from infersight.serve.sidecar import AgentOptions, AgentProcess
from infersight.serve.startup_heap import freeze_startup_heap

log = logging.getLogger("infersight.serve")


def uvicorn_config(app: object, config: ServeConfig, gate: ConnectionGate | None = None) -> uvicorn.Config:
    """h11 guarded by the HTTP limits: the connection bound (`gate`), the header bound and the
    header-read deadline hold before any request reaches the app (http.limits.GuardedH11Protocol)."""
    return uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", access_log=False,
                          **config.limits.uvicorn_options(openai_error_body, gate))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def serve(config: ServeConfig, engine_config: EngineConfig, probe_config: ProbeConfig,
          agent: AgentOptions | None = None) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers), then stop the engine and the agent and remove the
    ring. Call from the main thread. The engine runs in a process of its own (serve.engine_process) unless
    config.engine_in_process."""
    # After its graceful shutdown uvicorn re-raises the signal it caught; SIGTERM's default action
    # would end the process before the cleanup below, so make it unwind like SIGINT does.
    signal.signal(signal.SIGTERM, _interrupt)
    if config.engine_in_process:
        _serve_in_process(config, engine_config, probe_config, agent)
        return
    engine = EngineClient(engine_config, probe_config, config.max_text_bytes, config.max_pending)
    engine.start()  # builds the engine, captures its graphs and warms the profiler there; raises its error
    log.info("engine process %d ready (%d CUDA graphs captured)", engine.pid, engine.graphs_captured)
    try:
        _run_http(config, engine, engine.ring_name, agent)
    finally:
        engine.stop()


def _serve_in_process(config: ServeConfig, engine_config: EngineConfig, probe_config: ProbeConfig,
                      agent: AgentOptions | None) -> None:
    probe = ProbeObserver(probe_config)
    try:
        engine = Engine(engine_config, probe)
        # Every decode graph before the first request, as vLLM captures at start-up: a lazy capture
        # would land on some request's step (nothing on the CPU or with --enforce-eager).
        captured = engine.capture_decode_graphs()
        if captured:
            log.info("captured %d CUDA graphs for decode steps", captured)
        # The profiler's one-time start-up too, so the first capture window does not pay it on a request;
        # on the engine thread, which starts the windows (Kineto ties its client to a thread).
        loop = EngineLoop(engine, ProbeWriter(probe, config.max_text_bytes), config.max_pending,
                          before_steps=lambda: log.info("profiler warmed up in %.2f s", probe.warm_profiler()))
        loop.start()
        try:
            _run_http(config, loop, probe.ring_name, agent)
        finally:
            loop.stop()
    finally:
        probe.close()


def _run_http(config: ServeConfig, engine: EngineHandle, ring_name: str,
              agent: AgentOptions | None) -> None:
    """The agent beside the ring (when asked), then uvicorn until the stop signal."""
    sidecar = AgentProcess(ring_name, config.model_name, agent) if agent is not None else None
    try:
        if sidecar is not None:
            sidecar.wait_ready()
        log.info("serving %s on http://%s:%d (probe ring %s)", config.model_name, config.host, config.port, ring_name)
        try:
            gate = ConnectionGate(config.max_connections, "serve")
            server = uvicorn.Server(uvicorn_config(build_app(engine, config, gate=gate), config, gate))
            # The engine is warm (in this process's engine thread, or Ready from its own process): freeze.
            freeze_startup_heap()
            server.run()
        except KeyboardInterrupt:
            pass  # uvicorn re-raises the stop signal after its graceful shutdown: a requested stop, not an error
    finally:
        if sidecar is not None:
            sidecar.stop()
