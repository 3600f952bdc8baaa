"""`serve`'s engine in a process of its own: the engine thread (serve.engine_loop) without the HTTP server.

One Python interpreter runs one thread at a time. In one process the engine thread and the HTTP event loop
took turns (1.01 cores on a 16-core H200 host, BENCHMARKS.md): every request's JSON, SSE chunk and
detokenisation delayed the next step. Here the engine runs alone, as vLLM V1 runs its EngineCore: the
front end (serve.engine_client) sends commands over one ZeroMQ socket and reads Batch messages from another
(serve.engine_wire). This process owns the engine, the probes and the probe ring, so every ring record is
still written from one thread (the ring has one producer).

It stops on Stop, when the front end's process is gone (its parent id changes), or when the engine
thread dies.
"""
from __future__ import annotations

import logging
import os
import pickle
import signal
import threading
from dataclasses import dataclass, replace

import zmq

from infersight.probes.config import ProbeConfig
from infersight.runtime.config import EngineConfig
from infersight.serve import engine_wire as W
from infersight.serve.engine_loop import Accepted, Delta, Done, EngineLoop, Event, Failed, Submission
from infersight.serve.metrics import ServerCounters

log = logging.getLogger("infersight.serve.engine")
_POLL_MS = 200  # how often an idle command loop checks that the front end and the engine thread live
# No bound of its own: the front end admits (serve.admission); this process takes what it is sent.
_UNBOUNDED = 1 << 30
_TERM = threading.Event()  # set by SIGTERM (a process has one set of signal handlers)


@dataclass(frozen=True)
class EngineProcessSpec:
    """Everything the process needs, pickled to it at spawn."""

    engine_config: EngineConfig
    probe_config: ProbeConfig
    max_text_bytes: int
    command_address: str  # the front end binds; this process connects
    event_address: str


class _Outbox:
    """The engine thread's deliveries as Batch messages on the event socket. Only the engine thread
    calls send (EngineLoop's deliver, and the warm-up hook that sends Ready), so the socket has one user."""

    def __init__(self, socket: zmq.Socket, counters: ServerCounters, keys: dict[int, int],
                 forget: dict[int, Submission]) -> None:
        self.socket = socket
        self.counters = counters
        self.keys = keys  # id(submission) -> the front end's key
        self.forget = forget
        self._last_counts: W.EngineCounts | None = None

    def message(self, msg: W.FromEngine) -> None:
        self.socket.send(W.engine_encoder.encode(msg), copy=False)

    def send(self, posts: list[tuple[Submission, Event]]) -> None:
        events: list[W.RequestEvent] = []
        for sub, event in posts:
            key = self.keys.get(id(sub), -1)
            if isinstance(event, Delta):
                events.append(W.TokensOut(key, event.token_ids))
            elif isinstance(event, Accepted):
                events.append(W.AcceptedOut(key, event.request_id, event.num_prompt_tokens))
            elif isinstance(event, Done):
                events.append(W.DoneOut(key, replace(event.output, trace_id=0)))
            elif isinstance(event, Failed):
                events.append(W.FailedOut(key, event.status, event.param, str(event.error)))
                if sub.request_id < 0:  # refused at admission: no NETWORK command will come for it
                    self._drop(key, sub)
        snap = self.counters.snapshot()
        counts = W.EngineCounts(snap["failed"], snap["probe_writes_failed"], snap["draft_fallbacks"])  # type: ignore[arg-type]
        moved = counts != self._last_counts
        self._last_counts = counts
        self.message(W.Batch(events, counts if moved else None))

    def _drop(self, key: int, sub: Submission) -> None:
        self.forget.pop(key, None)
        self.keys.pop(id(sub), None)


def run(spec: EngineProcessSpec) -> None:
    """The process's entry point (multiprocessing, spawn)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s infersight-engine %(levelname)s %(message)s")
    # A terminal's Ctrl-C reaches the whole process group: the front end stops this process itself (Stop),
    # after its requests are answered. SIGTERM sent here alone stops it the same way.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: _TERM.set())
    parent = os.getppid()
    context = zmq.Context()
    events = context.socket(zmq.PUSH)
    events.setsockopt(zmq.LINGER, 2000)
    events.connect(spec.event_address)
    commands = context.socket(zmq.PULL)
    commands.setsockopt(zmq.LINGER, 0)
    commands.connect(spec.command_address)
    try:
        _serve(spec, parent, commands, events)
    finally:
        commands.close()
        events.close()
        context.term()


def _serve(spec: EngineProcessSpec, parent: int, commands: zmq.Socket, events: zmq.Socket) -> None:
    from infersight.probes.observer import ProbeObserver
    from infersight.runtime.engine.engine import Engine
    from infersight.serve.probe_records import ProbeWriter
    from infersight.serve.startup_heap import freeze_startup_heap

    probe = None
    try:
        probe = ProbeObserver(spec.probe_config)
        engine = Engine(spec.engine_config, probe)
        captured = engine.capture_decode_graphs()  # before the first request, as vLLM captures at start-up
    except Exception as exc:  # noqa: BLE001 -- the front end raises it; nothing is served
        if probe is not None:
            probe.close()
        try:
            error = pickle.dumps(exc)
        except Exception:  # noqa: BLE001 -- some exceptions hold what will not pickle; the text still goes
            error = b""
        events.send(W.engine_encoder.encode(W.StartFailed(error, f"{type(exc).__name__}: {exc}")))
        return
    if captured:
        log.info("captured %d CUDA graphs for decode steps", captured)
    counters = ServerCounters()
    subs: dict[int, Submission] = {}  # the front end's key -> this process's copy, until its NETWORK command
    keys: dict[int, int] = {}
    outbox = _Outbox(events, counters, keys, subs)

    def before_steps() -> None:
        # The profiler's one-time start-up on the thread that starts the capture windows, then Ready: the
        # front end sends no request before it, so this is the socket's only user until then.
        log.info("profiler warmed up in %.2f s", probe.warm_profiler())
        freeze_startup_heap()  # the last of start-up: nothing serving allocates is frozen
        outbox.message(W.Ready(probe.ring_name, loop.max_model_len, captured))

    loop = EngineLoop(engine, ProbeWriter(probe, spec.max_text_bytes), _UNBOUNDED, counters,
                      before_steps=before_steps, deliver=outbox.send, detokenize=False)
    loop.start()
    try:
        while loop.alive:
            if not commands.poll(_POLL_MS):
                if _TERM.is_set():
                    log.info("SIGTERM: stopping")
                    return
                if os.getppid() != parent:
                    log.warning("the front end is gone; stopping")
                    return
                continue
            msg = W.command_decoder.decode(commands.recv(copy=False))
            if isinstance(msg, W.Stop):
                return
            if isinstance(msg, W.Submit):
                sub = msg.submission()
                subs[msg.key] = sub
                keys[id(sub)] = msg.key
                loop.submit(sub)
            elif isinstance(msg, W.Abort):
                if msg.key in subs:
                    loop.abort(subs[msg.key])
            elif isinstance(msg, W.Network):  # the request's last word: forget it after this
                sub = subs.pop(msg.key, None)
                if sub is not None:
                    keys.pop(id(sub), None)
                    loop.network_done(sub, msg.receive_ns, msg.first_byte_ns, msg.last_byte_ns)
        log.error("the engine thread stopped")
    finally:
        loop.stop()
        probe.close()
