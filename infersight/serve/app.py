"""`infersight serve`'s HTTP surface (Starlette): an OpenAI-compatible API in front of the engine.

POST /v1/completions          text completion (stream: SSE `data: {...}` chunks, then `data: [DONE]`)
POST /v1/chat/completions     chat completion (same streaming)
GET  /v1/models               the one served model
GET  /health                  engine alive (its process, or its thread), requests in flight, counters
GET  /metrics                 the server's counters (Prometheus text)

Request headers: traceparent/tracestate (W3C; the request span is the caller's span's child),
x-infersight-task (the task label), x-infersight-session-id and x-infersight-user-id (span
session.id and user.id; the body's `user` also sets user.id). Response headers carry the engine's
x-infersight-request-id and the x-infersight-trace-id it ran under.

Each generating response is timed from its arrival (body not yet read) to its first and
last body byte; the times go to the engine thread, which writes the NETWORK record.

The whole app sits behind infersight.http.limits.LimitedApp (headers 431, body 413, slow body 408,
JSON nesting 400, and JSON bodies for 404, 405 and 500), each refusal counted by reason.
"""
from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infersight.http.connections import ConnectionGate
from infersight.http.limits import RECEIVED_NS, LimitedApp, routes_app
from infersight.probes.records import TextField
from infersight.serve import protocol as P
from infersight.serve.api_error import openai_error_body
from infersight.serve.config import ServeConfig
from infersight.serve.engine_handle import EngineHandle
from infersight.serve.engine_loop import Accepted, Delta, Done, Event, Failed, Submission
from infersight.serve.metrics import ServerCounters
from infersight.serve.probe_records import ServedRecord
from infersight.serve.tracecontext import extract

TASK_HEADER = "x-infersight-task"
SESSION_HEADER = "x-infersight-session-id"
USER_HEADER = "x-infersight-user-id"


def error_response(err: P.APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


class TimedResponse(Response):
    """Sends `inner`, noting when its first and last non-empty body chunk went out; then `on_done`
    (also when the client went away mid-response)."""

    def __init__(self, inner: Response, on_done: Callable[[int, int], None]) -> None:  # noqa: D107
        # No super().__init__: every byte comes from inner; these are for whoever inspects the response.
        self.inner, self.on_done = inner, on_done
        self.status_code, self.raw_headers, self.background = inner.status_code, inner.raw_headers, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        first = last = 0

        async def timed_send(message: Message) -> None:
            nonlocal first, last
            await send(message)
            if message["type"] == "http.response.body" and message.get("body"):
                last = time.monotonic_ns()
                first = first or last

        try:
            await self.inner(scope, receive, timed_send)
        finally:
            end = time.monotonic_ns()
            self.on_done(first or end, last or end)


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, 400 if it is not one. Its size and nesting are bounded before it
    gets here (LimitedApp); RecursionError is caught all the same, whatever the server in front."""
    try:
        body = json.loads(await request.body())
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise P.APIError(400, f"request body is not valid JSON: {str(exc)[:200]}", code="invalid_json",
                         reason="invalid_json")
    if not isinstance(body, dict):
        raise P.APIError(400, "request body must be a JSON object", code="invalid_json", reason="invalid_json")
    return body


def build_app(engine: EngineHandle, config: ServeConfig, counters: ServerCounters | None = None,
              gate: ConnectionGate | None = None) -> ASGIApp:
    """The app behind its HTTP limits; `gate` (the server's connection bound) is shown on /metrics."""
    counters = counters if counters is not None else engine.counters
    registry = counters.registry()
    if gate is not None:
        registry.register(gate.collector())

    def bounded(value: str | None) -> str | None:
        return value[: config.max_id_bytes] if value else None

    async def generate(request: Request, parse: Callable[..., P.GenerationRequest]) -> Response:
        receive_ns = request.scope.get(RECEIVED_NS) or time.monotonic_ns()  # before the limits read the body
        try:
            req = parse(await read_json(request), config.model_name, config.default_max_tokens, engine.max_model_len)
        except P.APIError as err:
            counters.reject(err.reason)
            return error_response(err)
        trace = extract(request.headers)
        if trace.invalid:
            counters.invalid_traceparent()
        if not engine.alive:
            counters.reject("engine_error")
            return error_response(P.APIError(503, "the engine has stopped", type="server_error",
                                             reason="engine_error"))
        if not engine.try_reserve():
            counters.reject("overloaded")
            err = P.APIError(429, f"the server has {engine.max_pending} requests in flight; retry later",
                             type="rate_limit_error", code="overloaded", reason="overloaded")
            return error_response(err, {"Retry-After": str(config.retry_after_s)})
        texts = {TextField.SESSION_ID: bounded(request.headers.get(SESSION_HEADER)),
                 TextField.USER_ID: bounded(request.headers.get(USER_HEADER) or req.user),
                 TextField.TRACESTATE: trace.tracestate}
        if config.export_content:
            texts[TextField.PROMPT] = req.prompt_record
        sub = Submission(req.prompt, ServedRecord(req.operation, receive_ns, trace, req.params, req.stream),
                         bounded(request.headers.get(TASK_HEADER)), asyncio.get_running_loop(),
                         {k: v for k, v in texts.items() if v}, export_completion=config.export_content)
        engine.submit(sub)
        first = await sub.events.get()
        if isinstance(first, Failed):
            refused = first.status == 400
            counters.reject("invalid_request" if refused else "engine_error")
            return error_response(P.APIError(first.status, str(first.error), param=first.param,
                                             type="invalid_request_error" if refused else "server_error"))
        assert isinstance(first, Accepted)
        rid = first.request_id
        prefix = "chatcmpl" if req.operation == "chat" else "cmpl"
        response_id = f"{prefix}-{trace.trace_id:032x}-{rid}"
        headers = {"x-infersight-request-id": str(rid), "x-infersight-trace-id": f"{trace.trace_id:032x}"}

        def done(first_byte: int, last_byte: int) -> None:
            engine.abort(sub)  # a no-op once finished; stops the work of a client that went away
            engine.network_done(sub, receive_ns, first_byte, last_byte)

        if req.stream:
            body = _sse(engine, sub, req, response_id, first.num_prompt_tokens)
            return TimedResponse(StreamingResponse(body, media_type="text/event-stream",
                                                   headers={**headers, "Cache-Control": "no-cache"}), done)
        events = await _collect(sub, request)
        failed = next((e for e in events if isinstance(e, Failed)), None)
        out = next((e.output for e in events if isinstance(e, Done)), None)
        if out is None:  # the engine failed it, or the client went away (then nobody reads this)
            if failed is not None:
                counters.reject("engine_error")
            message = str(failed.error) if failed is not None else "the client closed the connection"
            return TimedResponse(error_response(P.APIError(500, message, type="server_error")), done)
        text = "".join(e.text for e in events if isinstance(e, Delta))
        use = P.usage(len(out.prompt_token_ids), len(out.token_ids), out.num_cached_tokens)
        return TimedResponse(JSONResponse(P.response_body(req, response_id, text, out.finish_reason, use),
                                          headers=headers), done)

    async def completions(request: Request) -> Response:
        return await generate(request, P.parse_completion)

    render_chat = P.chat_renderer(engine.tokenizer)  # a checkpoint's chat template, if it has one

    async def chat(request: Request) -> Response:
        return await generate(request, functools.partial(P.parse_chat, render=render_chat))

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": config.model_name, "object": "model", "created": 0,
                                                          "owned_by": "infersight"}]})

    async def health(request: Request) -> Response:
        ok = engine.alive
        return JSONResponse({"status": "ok" if ok else "engine_stopped", "model": config.model_name,
                             "pending": engine.pending, "counters": counters.snapshot()},
                            status_code=200 if ok else 503)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app = routes_app([
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics)])
    return LimitedApp(app, config.limits, openai_error_body, lambda reason, message: counters.reject(reason))


async def _collect(sub: Submission, request: Request) -> list[Event]:
    """Every event up to Done or Failed, or up to the client disconnecting (the response's on_done
    then aborts the request)."""
    out: list[Event] = []
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        while True:
            nxt = asyncio.ensure_future(sub.events.get())
            await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                nxt.cancel()
                return out
            event = nxt.result()
            out.append(event)
            if isinstance(event, (Done, Failed)):
                return out
    finally:
        gone.cancel()


async def _disconnected(receive: Callable[[], Awaitable[Message]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _sse(engine: EngineHandle, sub: Submission, req: P.GenerationRequest, response_id: str,
               prompt_tokens: int) -> AsyncIterator[str]:
    """The SSE body. If the client goes away the generator is closed mid-way: abort the request."""
    finished, first, completion_tokens = False, True, 0

    def running() -> dict[str, Any] | None:
        return P.running_usage(prompt_tokens, completion_tokens) if req.continuous_usage else None

    def data(body: dict[str, Any]) -> str:
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    try:
        while True:
            event: Event | None = await sub.events.get()
            # Deltas already queued behind this one (the event loop fell behind the engine) go out as one
            # chunk, as vLLM's output collector merges a slow consumer's outputs: one JSON body and one
            # send through the middleware instead of one per token. Under light load the queue holds one.
            text = ""
            while isinstance(event, Delta):
                text += event.text
                completion_tokens += event.num_tokens
                event = sub.events.get_nowait() if not sub.events.empty() else None
            parts = []
            if text:
                parts.append(data(P.chunk_body(req, response_id, text, None, first, running=running())))
                first = False
            if isinstance(event, Done):
                out = event.output
                completion_tokens = len(out.token_ids)
                parts.append(data(P.chunk_body(req, response_id, None, out.finish_reason or "stop", first,
                                               running=running())))
                if req.include_usage:
                    use = P.usage(len(out.prompt_token_ids), len(out.token_ids), out.num_cached_tokens)
                    parts.append(data(P.chunk_body(req, response_id, None, None, False, use)))
                parts.append("data: [DONE]\n\n")
                finished = True
            elif isinstance(event, Failed):
                parts.append(data(P.APIError(500, str(event.error), type="server_error").body()))
                parts.append("data: [DONE]\n\n")
                finished = True
            if parts:
                yield "".join(parts)
            if finished:
                return
    finally:
        if not finished:
            engine.abort(sub)
