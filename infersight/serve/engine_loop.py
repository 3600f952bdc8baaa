"""The engine thread: the one thread that calls Engine.step(), and the hand-off to the HTTP handlers.

Handlers run on the asyncio loop; the engine runs here. They meet through two one-way channels:

    handler --(Submission / abort / network-done commands, a thread-safe queue)--> engine thread
    engine thread --(Accepted / Delta / Done / Failed, via loop.call_soon_threadsafe)--> handler's queue

Keeping every engine call and every probe-ring write on this thread means neither needs a lock:
the engine is not thread-safe, and the ring has a single producer. Admission is bounded
(`try_reserve`): past max_pending unfinished requests the handler answers 429 instead of queueing.

Failures are confined and counted: a request whose own sampling or probes raise is finished by
the engine with reason "error" and only its handler gets Failed (scope "request"); a step that
raises as a whole fails the requests in flight (scope "step"); a probe record that cannot be
written is counted and the request goes on. A request the draft model fails for is not failed: it
decodes without speculation (runtime.speculative.verify.DraftFallbacks), counted apart.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from infersight.probes.records import TextField
from infersight.runtime.engine.engine import Engine
from infersight.runtime.engine.outputs import RequestOutput
from infersight.serve.admission import Admission
from infersight.serve.metrics import ServerCounters
from infersight.serve.probe_records import ProbeWriter, ServedRecord

log = logging.getLogger("infersight.serve")
_IDLE_WAIT_S = 0.05  # how long an idle engine thread blocks on the command queue before re-checking stop


@dataclass
class Accepted:
    request_id: int
    num_prompt_tokens: int = 0


@dataclass
class Delta:
    """New output of one request. token_ids: the tokens themselves, only when the loop leaves the text to
    the front end (EngineLoop(detokenize=False): the engine process; text is then "")."""

    text: str
    num_tokens: int
    token_ids: list[int] = field(default_factory=list)


@dataclass
class Done:
    output: RequestOutput


@dataclass
class Failed:
    """The request ended without output. status: 400 when the engine refused it at admission
    (param names the field), 500 when it failed while running."""

    error: Exception
    status: int = 500
    param: str | None = None


Event = Union[Accepted, Delta, Done, Failed]


@dataclass
class Submission:
    """One request on its way through the engine. texts: strings for the span (session and user ids,
    tracestate, and the prompt when content export is on), written once the request has an id."""

    prompt: str | list[int]
    record: ServedRecord
    task: str | None
    loop: asyncio.AbstractEventLoop
    texts: dict[TextField, str] = field(default_factory=dict)
    export_completion: bool = False
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    request_id: int = -1



def _put_all(posts: list[tuple[Submission, Event]]) -> None:
    for sub, event in posts:
        sub.events.put_nowait(event)


def post_all(posts: list[tuple[Submission, Event]]) -> None:
    """From the engine thread: every (submission, event) onto its handler's queue, in order, with one
    call_soon_threadsafe per event loop; a loop that is gone has nobody to tell."""
    by_loop: dict[int, tuple[asyncio.AbstractEventLoop, list[tuple[Submission, Event]]]] = {}
    for sub, event in posts:
        by_loop.setdefault(id(sub.loop), (sub.loop, []))[1].append((sub, event))
    for loop, items in by_loop.values():
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:
            pass


@dataclass
class _Active:
    sub: Submission
    decoder: Any  # the engine tokenizer's stream_decoder() (text of each new piece of tokens); None: no text
    sent: int = 0


Deliver = Callable[[list[tuple[Submission, Event]]], None]


class EngineLoop:
    def __init__(self, engine: Engine, writer: ProbeWriter | None, max_pending: int = 256,
                 counters: ServerCounters | None = None, before_steps: Callable[[], object] | None = None,
                 deliver: Deliver = post_all, detokenize: bool = True) -> None:
        """before_steps: run on the engine thread before its first step, and start() waits for it (the
        profiler's one-time start-up: on the thread that will start the capture windows, before any
        request). deliver: where the engine thread's events go (default: each handler's event loop);
        detokenize=False sends token ids instead of text (the engine process, whose front end decodes)."""
        self.engine = engine
        self.writer = writer
        self.max_pending = max_pending
        self.counters = counters if counters is not None else ServerCounters()
        self.max_model_len = int(engine.config.max_model_len or engine.config.model_config.max_seq_len)
        self._commands: queue.SimpleQueue[tuple[str, Submission, tuple[int, ...]]] = queue.SimpleQueue()
        self._active: dict[int, _Active] = {}
        self._admission = Admission(max_pending)
        self._deliver_events = deliver
        self._detokenize = detokenize
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infersight-engine", daemon=True)
        self._before_steps = before_steps
        self._ready = threading.Event()

    # -- the handler side (any thread) -----------------------------------------------------------------
    def start(self, ready_timeout_s: float = 120.0) -> None:
        self._thread.start()
        self._ready.wait(ready_timeout_s)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def pending(self) -> int:
        return self._admission.pending

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def try_reserve(self) -> bool:
        """Admit one more request, or refuse (the caller answers 429). Released when it finishes."""
        return self._admission.try_reserve()

    def _release(self) -> None:
        self._admission.release()

    def submit(self, sub: Submission) -> None:
        self._commands.put(("submit", sub, ()))

    def abort(self, sub: Submission) -> None:
        self._commands.put(("abort", sub, ()))

    def network_done(self, sub: Submission, receive_ns: int, first_byte_ns: int, last_byte_ns: int) -> None:
        """The response's timing, for the NETWORK record (after the last byte: after FINISHED)."""
        self._commands.put(("network", sub, (receive_ns, first_byte_ns, last_byte_ns)))

    # -- the engine thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._before_steps is not None:
                self._before_steps()
        except Exception:  # noqa: BLE001 -- a warm-up must not keep the server from serving
            log.exception("the engine thread's warm-up failed; serving without it")
        finally:
            self._ready.set()
        while not self._stop.is_set():
            try:
                self._drain(block=not self.engine.has_unfinished())
                self._deliver()
                if self.engine.has_unfinished():
                    self.engine.step()
                    self._deliver()
                    fallbacks = self.engine.draft_fallbacks
                    self.counters.draft_fallbacks(fallbacks.requests, fallbacks.steps)
            except Exception as exc:  # noqa: BLE001 -- fail the requests in flight, keep serving
                log.exception("engine step failed; failing %d requests in flight", len(self._active))
                self.counters.request_failed("step", len(self._active))
                self._fail_all(RuntimeError(f"the engine step failed: {type(exc).__name__}: {exc}"))
        self._fail_all(RuntimeError("the server is shutting down"))

    def _drain(self, block: bool) -> None:
        try:
            item = self._commands.get(timeout=_IDLE_WAIT_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._command(*item)
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return

    def _command(self, kind: str, sub: Submission, args: tuple[int, ...]) -> None:
        try:
            if kind == "submit":
                self._add(sub)
            elif kind == "abort":
                if sub.request_id in self._active:
                    self.engine.abort_request(sub.request_id)
            elif kind == "network" and sub.request_id >= 0 and self.writer is not None:
                self._write(self.writer.network, sub.request_id, *args)
        except Exception as exc:  # noqa: BLE001 -- one bad command must not stop the thread
            log.exception("engine command %s failed", kind)
            if kind == "submit" and sub.request_id < 0:
                self._release()
                self._deliver_events([(sub, Failed(exc))])

    def _add(self, sub: Submission) -> None:
        try:
            rid = self.engine.add_request(sub.prompt, sub.record.params, task=sub.task,
                                          trace_id=sub.record.trace.trace_id)
        except ValueError as exc:  # InvalidRequestError: the prompt or a parameter; nothing was queued
            self._release()
            self._deliver_events([(sub, Failed(exc, 400, getattr(exc, "param", "prompt")))])
            return
        sub.request_id = rid
        self._active[rid] = _Active(sub, self.engine.tokenizer.stream_decoder() if self._detokenize else None)
        self._deliver_events([(sub, Accepted(rid, len(self.engine.requests[rid].prompt_token_ids)))])
        if self.writer is not None:  # right after ARRIVED, so the sidecar sees it before FINISHED
            self._write(self.writer.served, rid, sub.record)
            for text_field, text in sub.texts.items():
                self._write(self.writer.text, rid, text_field, text)

    def _write(self, write: Any, *args: Any) -> None:
        """One probe record; a failure costs that record and a count, never the request."""
        try:
            write(*args)
        except Exception as exc:  # noqa: BLE001
            self.counters.probe_write_failed()
            log.warning("probe record not written (%s): %s: %s", getattr(write, "__name__", "?"),
                        type(exc).__name__, exc)

    def _deliver(self) -> None:
        """New tokens of every active request to its handler; finished ones leave the engine. The
        step's events go to each event loop in one call_soon_threadsafe (post_all), not one per
        request: at 48 requests a step that was 48 wake-ups of the loop and 48 self-pipe writes."""
        posts: list[tuple[Submission, Event]] = []
        for rid, act in list(self._active.items()):
            req = self.engine.requests[rid]
            new = req.output_token_ids[act.sent:]
            if new:
                act.sent += len(new)
                if act.decoder is None:
                    posts.append((act.sub, Delta("", len(new), list(new))))
                else:
                    posts.append((act.sub, Delta(act.decoder.step(new), len(new))))
            if req.is_finished:
                tail = act.decoder.finish() if act.decoder is not None else ""
                if tail:
                    posts.append((act.sub, Delta(tail, 0)))
                error = req.error
                out = self.engine.release(rid)
                del self._active[rid]
                self._release()
                if error is not None:  # the engine failed this request alone (Engine.fail_request)
                    self.counters.request_failed("request")
                    posts.append((act.sub, Failed(RuntimeError(f"the engine failed this request: "
                                                               f"{type(error).__name__}: {error}"))))
                    continue
                if act.sub.export_completion and self.writer is not None:
                    self._write(self.writer.text, rid, TextField.COMPLETION, out.text)
                posts.append((act.sub, Done(out)))
        if posts:
            self._deliver_events(posts)

    def _fail_all(self, exc: Exception) -> None:
        for rid, act in list(self._active.items()):
            try:
                self.engine.abort_request(rid)
                self.engine.release(rid)
            except Exception:  # noqa: BLE001 -- the engine may be what broke
                log.debug("could not abort request %d", rid, exc_info=True)
            del self._active[rid]
            self._release()
            self._deliver_events([(act.sub, Failed(exc))])
