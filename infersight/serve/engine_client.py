"""`serve`'s front end to an engine in its own process (serve.engine_process).

To the HTTP app it is what EngineLoop is (submit, abort, network_done, try_reserve, alive, pending,
max_model_len, tokenizer, counters): the app does not know which one it talks to. Underneath, commands
go out on a ZeroMQ socket; one reader thread takes the engine's Batch messages, turns token ids into text
(each request's stream decoder lives here, off the engine's interpreter) and hands each handler its events
on its event loop, one call_soon_threadsafe per loop per batch.

Admission is counted here (serve.admission). If the engine process dies, every request in flight fails
(scope "step", 500) and /health answers 503.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import zmq

from infersight.probes.config import ProbeConfig
from infersight.runtime.checkpoints.hf_tokenizer import tokenizer_for
from infersight.runtime.config import EngineConfig
from infersight.serve import engine_wire as W
from infersight.serve.admission import Admission
from infersight.serve.engine_loop import Accepted, Delta, Done, Event, Failed, Submission, post_all
from infersight.serve.engine_process import EngineProcessSpec, run
from infersight.serve.metrics import ServerCounters

log = logging.getLogger("infersight.serve")
_READ_POLL_MS = 200  # how often the reader checks that the engine process lives


class EngineStartError(RuntimeError):
    """The engine process ended before it was ready, without saying why."""


@dataclass
class _InFlight:
    sub: Submission
    decoder: Any = None  # the tokenizer's stream decoder, from Accepted on


class EngineClient:
    def __init__(self, engine_config: EngineConfig, probe_config: ProbeConfig, max_text_bytes: int,
                 max_pending: int = 256, counters: ServerCounters | None = None,
                 start_timeout_s: float = 900.0, tokenizer: Any = None) -> None:
        """start_timeout_s: how long the engine may take to build, load weights and capture its graphs.
        tokenizer: what turns the engine's token ids into text here (default: the model's own)."""
        self.engine_config = engine_config
        self.probe_config = probe_config
        self.max_text_bytes = max_text_bytes
        self.max_pending = max_pending
        self.counters = counters if counters is not None else ServerCounters()
        self.start_timeout_s = start_timeout_s
        self.tokenizer = tokenizer if tokenizer is not None else tokenizer_for(engine_config.model_config)
        self.max_model_len = 0
        self.ring_name = ""
        self.graphs_captured = 0
        self._admission = Admission(max_pending)
        self._inflight: dict[int, _InFlight] = {}  # key -> request, until Done or Failed
        self._keys: dict[int, int] = {}  # id(submission) -> key, until its NETWORK command (abort needs it)
        self._next_key = 0
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()
        self._engine_counts = W.EngineCounts({}, 0, {})
        self._dir = tempfile.mkdtemp(prefix="infersight-engine-")
        self._context = zmq.Context()
        self._commands = self._context.socket(zmq.PUSH)
        self._commands.setsockopt(zmq.LINGER, 1000)
        self._events = self._context.socket(zmq.PULL)
        self._events.setsockopt(zmq.LINGER, 0)
        self._process: multiprocessing.process.BaseProcess | None = None
        self._reader = threading.Thread(target=self._read, name="infersight-engine-reader", daemon=True)

    # -- life ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the engine process and wait until it is ready; its start-up error is raised here, as the
        type it had (a bad --model stays a ValueError)."""
        command_address = f"ipc://{self._dir}/commands"
        event_address = f"ipc://{self._dir}/events"
        self._commands.bind(command_address)
        self._events.bind(event_address)
        spec = EngineProcessSpec(self.engine_config, self.probe_config, self.max_text_bytes, command_address,
                                 event_address)
        # spawn: CUDA cannot be used in a forked child, and a fork would copy the front end's threads' locks
        self._process = multiprocessing.get_context("spawn").Process(target=run, args=(spec,),
                                                                     name="infersight-engine", daemon=True)
        self._process.start()
        ready = self._wait_ready()
        self.ring_name, self.max_model_len, self.graphs_captured = (ready.ring_name, ready.max_model_len,
                                                                    ready.graphs_captured)
        self._reader.start()

    def _wait_ready(self) -> W.Ready:
        deadline = time.monotonic() + self.start_timeout_s
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._events.poll(_READ_POLL_MS):
                msg = W.engine_decoder.decode(self._events.recv(copy=False))
                if isinstance(msg, W.Ready):
                    return msg
                if isinstance(msg, W.StartFailed):
                    self._process.join(10)
                    self._cleanup()
                    error = _unpickled(msg.error)
                    raise error if error is not None else EngineStartError(msg.message)
                continue  # nothing else comes before Ready
            if not self._process.is_alive():
                self._cleanup()
                raise EngineStartError(f"the engine process exited during start-up (exit code "
                                       f"{self._process.exitcode})")
        self.stop()
        raise EngineStartError(f"the engine process was not ready within {self.start_timeout_s:.0f} s")

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the engine process (it fails what is in flight and removes the probe ring) and the reader."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._process is not None and self._process.is_alive():
            self._send(W.Stop())
            self._process.join(timeout)
            if self._process.is_alive():
                log.warning("the engine process did not stop within %.0f s; killing it", timeout)
                self._process.kill()
                self._process.join(5)
        if self._reader.is_alive():
            self._reader.join(timeout)
        self._fail_all("the server is shutting down")
        self._cleanup()

    def _cleanup(self) -> None:
        self._commands.close()
        self._events.close()
        self._context.term()
        for name in ("commands", "events"):
            try:
                os.unlink(os.path.join(self._dir, name))
            except OSError:
                pass
        try:
            os.rmdir(self._dir)
        except OSError:
            pass

    @property
    def alive(self) -> bool:
        return (not self._stopping.is_set() and self._process is not None and self._process.is_alive()
                and self._reader.is_alive())

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # -- the handler side (the event loop) -----------------------------------------------------------------
    @property
    def pending(self) -> int:
        return self._admission.pending

    def try_reserve(self) -> bool:
        return self._admission.try_reserve()

    def submit(self, sub: Submission) -> None:
        with self._send_lock:
            key = self._next_key
            self._next_key += 1
            self._inflight[key] = _InFlight(sub)
            self._keys[id(sub)] = key
            sent = self._send_now(W.Submit.of(key, sub))
        if not sent:
            self._keys.pop(id(sub), None)
            if self._inflight.pop(key, None) is not None:
                self._admission.release()
            post_all([(sub, Failed(RuntimeError("the engine process is not reachable")))])

    def abort(self, sub: Submission) -> None:
        key = self._keys.get(id(sub))
        if key is not None:
            self._send(W.Abort(key))

    def network_done(self, sub: Submission, receive_ns: int, first_byte_ns: int, last_byte_ns: int) -> None:
        key = self._keys.pop(id(sub), None)
        if key is not None:
            self._send(W.Network(key, receive_ns, first_byte_ns, last_byte_ns))

    def _send(self, msg: W.Command) -> None:
        with self._send_lock:
            self._send_now(msg)

    def _send_now(self, msg: W.Command) -> bool:
        """Never blocks the event loop: with no engine connected a PUSH socket would wait for one. False
        when the message could not go (the engine process is gone, or its queue is full)."""
        try:
            self._commands.send(W.command_encoder.encode(msg), zmq.NOBLOCK, copy=False)
            return True
        except zmq.ZMQError:
            return False

    # -- the reader thread ---------------------------------------------------------------------------------
    def _read(self) -> None:
        assert self._process is not None
        try:
            while not self._stopping.is_set():
                if not self._events.poll(_READ_POLL_MS):
                    if not self._process.is_alive():
                        break
                    continue
                msg = W.engine_decoder.decode(self._events.recv(copy=False))
                if isinstance(msg, W.Batch):
                    self._batch(msg)
        except Exception:  # noqa: BLE001 -- logged; what is in flight fails below
            log.exception("reading the engine process's output failed")
        if not self._stopping.is_set():
            code = self._process.exitcode
            log.error("the engine process exited (exit code %s); failing %d requests in flight", code,
                      len(self._inflight))
            self.counters.request_failed("step", len(self._inflight))
            self._fail_all(f"the engine process exited (exit code {code})")

    def _batch(self, msg: W.Batch) -> None:
        posts: list[tuple[Submission, Event]] = []
        for ev in msg.events:
            fl = self._inflight.get(ev.key)
            if fl is None:
                continue
            try:
                self._event(ev, fl, posts)
            except Exception as exc:  # noqa: BLE001 -- one request's text failed: fail it alone, go on
                log.exception("the front end failed request key %d", ev.key)
                self.counters.request_failed("request")
                posts.append((fl.sub, Failed(RuntimeError(f"the front end failed this request: "
                                                          f"{type(exc).__name__}: {exc}"))))
                self._send(W.Abort(ev.key))
                self._finish(ev.key)
        if msg.counts is not None:
            self._absorb(msg.counts)
        if posts:
            post_all(posts)

    def _event(self, ev: W.RequestEvent, fl: _InFlight, posts: list[tuple[Submission, Event]]) -> None:
        if isinstance(ev, W.TokensOut):
            posts.append((fl.sub, Delta(fl.decoder.step(ev.token_ids), len(ev.token_ids))))
        elif isinstance(ev, W.AcceptedOut):
            fl.sub.request_id = ev.request_id
            fl.decoder = self.tokenizer.stream_decoder()
            posts.append((fl.sub, Accepted(ev.request_id, ev.num_prompt_tokens)))
        elif isinstance(ev, W.DoneOut):
            tail = fl.decoder.finish()
            if tail:
                posts.append((fl.sub, Delta(tail, 0)))
            posts.append((fl.sub, Done(replace(ev.output, trace_id=fl.sub.record.trace.trace_id))))
            self._finish(ev.key)
        elif isinstance(ev, W.FailedOut):
            error = ValueError(ev.message) if ev.status == 400 else RuntimeError(ev.message)
            posts.append((fl.sub, Failed(error, ev.status, ev.param)))
            if fl.decoder is None:  # refused at admission: no NETWORK will follow
                self._keys.pop(id(fl.sub), None)
            self._finish(ev.key)

    def _finish(self, key: int) -> None:
        del self._inflight[key]
        self._admission.release()

    def _absorb(self, counts: W.EngineCounts) -> None:
        """The engine side's totals into this server's counters, as increments since the last totals."""
        last = self._engine_counts
        for scope, n in counts.failed.items():
            if n > last.failed.get(scope, 0):
                self.counters.request_failed(scope, n - last.failed.get(scope, 0))
        for _ in range(counts.probe_writes_failed - last.probe_writes_failed):
            self.counters.probe_write_failed()
        self.counters.draft_fallbacks(counts.draft_fallbacks.get("request", 0), counts.draft_fallbacks.get("step", 0))
        self._engine_counts = counts

    def _fail_all(self, message: str) -> None:
        posts: list[tuple[Submission, Event]] = []
        for key in list(self._inflight):
            fl = self._inflight.get(key)
            if fl is None:
                continue
            posts.append((fl.sub, Failed(RuntimeError(message))))
            self._finish(key)
        if posts:
            post_all(posts)


def _unpickled(data: bytes) -> BaseException | None:
    if not data:
        return None
    try:
        error = pickle.loads(data)
    except Exception:  # noqa: BLE001 -- a type this process cannot rebuild: the message still goes
        return None
    return error if isinstance(error, BaseException) else None
