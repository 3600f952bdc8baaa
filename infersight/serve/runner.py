"""Wiring for `infersight serve`: engine with probes, the engine thread, uvicorn, and the agent."""
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
from infersight.serve.engine_loop import EngineLoop
from infersight.serve.probe_records import ProbeWriter
from infersight.serve.sidecar import AgentOptions, AgentProcess

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
    """Serve until SIGINT/SIGTERM (uvicorn's handlers), then stop the engine thread and the agent and
    remove the ring. Call from the main thread."""
    # After its graceful shutdown uvicorn re-raises the signal it caught; SIGTERM's default action
    # would end the process before the cleanup below, so make it unwind like SIGINT does.
    signal.signal(signal.SIGTERM, _interrupt)
    probe = ProbeObserver(probe_config)
    sidecar = None
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
        if agent is not None:
            sidecar = AgentProcess(probe.ring_name, config.model_name, agent)
            sidecar.wait_ready()
        loop.start()
        log.info("serving %s on http://%s:%d (probe ring %s)", config.model_name, config.host, config.port,
                 probe.ring_name)
        try:
            gate = ConnectionGate(config.max_connections, "serve")
            uvicorn.Server(uvicorn_config(build_app(loop, config, gate=gate), config, gate)).run()
        except KeyboardInterrupt:
            pass  # uvicorn re-raises the stop signal after its graceful shutdown: a requested stop, not an error
        finally:
            loop.stop()
    finally:
        if sidecar is not None:
            sidecar.stop()
        probe.close()
