"""InfersightMiddleware: a pure ASGI middleware for vLLM's ``--middleware`` that writes what only
the HTTP layer knows about a request into the process's probe ring (writer.py).

    python -m vllm.entrypoints.openai.api_server ... \\
        --middleware infersight.vllm.middleware.InfersightMiddleware

For each POST to /v1/completions or /v1/chat/completions:
1. request id: without an ``X-Request-Id`` header it adds one (32 random hex digits, no dashes,
   so ``ids.base_and_index`` cannot mistake a tail of it for a choice index). vLLM names the request
   after that header, so the middleware knows the base id and the join key (``ids.join_key``) that the
   stat logger will compute from ``FinishedRequestStats.request_id``;
2. when the body has arrived, before vLLM's handler sees it (so before the engine does): the
   caller's trace (``traceparent``/``tracestate``, parsed by ``serve.tracecontext``) and task
   (``x-infersight-task``, bounded like `infersight serve` does) go to the writer. The stat logger
   puts them on the request's records, which is how the agent labels vLLM requests: through the
   same records it reads from our engine. Then a SERVED record per engine request of the call (a
   completions prompt list makes several), and REQUEST_TEXT for the tracestate and the user and
   session ids. Prompt text only with ``INFERSIGHT_EXPORT_CONTENT=1``;
3. after the last response byte: NETWORK (received, first and last body byte sent; monotonic ns).

Sampling fields the caller left out are written as unknown (NaN temperature/top_p, top_k and seed
-1, max_tokens 0), except max_tokens of a completion, which vLLM defaults to 16. Every failure is
counted and logged once by the writer; the request goes through untouched either way.
"""
from __future__ import annotations

import json
import math
import secrets
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infersight.probes.records import Operation, RecordKind, ServedFlag, TextField
from infersight.serve.app import SESSION_HEADER, TASK_HEADER, USER_HEADER
from infersight.serve.tracecontext import IncomingTrace, extract
from infersight.vllm.ids import join_key
from infersight.vllm.writer import VllmRingWriter, process_writer

OPERATIONS = {"/v1/completions": Operation.TEXT_COMPLETION, "/v1/chat/completions": Operation.CHAT}
REQUEST_ID_HEADER = "x-request-id"
#: Bodies beyond this are passed on but not parsed (their SERVED record has the unknown values).
MAX_PARSED_BODY_BYTES = 4 << 20
_DEFAULT_MAX_TOKENS = {Operation.TEXT_COMPLETION: 16, Operation.CHAT: 0}


def new_request_id() -> str:
    return secrets.token_hex(16)


def engine_request_count(operation: Operation, body: dict[str, Any]) -> int:
    """How many engine requests vLLM makes of one call: one per prompt of a completions prompt list
    (a list of strings or of token-id lists; a flat token-id list is one prompt). ``n`` > 1 is not
    split: vLLM's parallel-sampling children share their parent's id."""
    prompt = body.get("prompt")
    if operation is Operation.TEXT_COMPLETION and isinstance(prompt, list) and prompt:
        if not all(isinstance(p, int) for p in prompt):
            return len(prompt)
    return 1


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else default


def _integer(body: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = body.get(key)
    return min(hi, max(lo, value)) if isinstance(value, int) and not isinstance(value, bool) else default


class _Call:
    """One observed POST: its ids, trace and task, and the times its response bytes left."""

    def __init__(self, scope: Scope, operation: Operation, writer: VllmRingWriter) -> None:
        self.receive_ns = time.monotonic_ns()
        self.operation, self.writer = operation, writer
        raw = list(scope.get("headers") or [])
        self.headers: dict[str, str] = {}
        for name, value in raw:  # the first of repeated headers, as Starlette's Headers.get does
            self.headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        self.scope = scope
        self.base_id = self.headers.get(REQUEST_ID_HEADER) or ""
        if not self.base_id:
            self.base_id = new_request_id()
            self.scope = {**scope, "headers": raw + [(REQUEST_ID_HEADER.encode(), self.base_id.encode())]}
        self.trace: IncomingTrace = extract(self.headers)
        self.keys: list[int] = []
        self.body = bytearray()
        self.body_too_large = False
        self.first_byte_ns = self.last_byte_ns = 0

    def _bounded(self, value: str | None) -> str | None:
        return value[: self.writer.settings.max_id_bytes] if value else None

    def on_body(self, message: Message) -> None:
        """Collect the request body; once complete, describe the request to the ring."""
        if self.keys:
            return
        chunk = message.get("body", b"")
        if not self.body_too_large:
            self.body += chunk
            if len(self.body) > MAX_PARSED_BODY_BYTES:
                self.body_too_large, self.body = True, bytearray()
        if not message.get("more_body", False):
            self.describe()

    def describe(self) -> None:
        body: dict[str, Any] = {}
        if not self.body_too_large and self.body:
            try:
                parsed = json.loads(self.body)
                body = parsed if isinstance(parsed, dict) else {}
            except ValueError:
                pass  # vLLM answers 400; the SERVED record keeps the unknown values
        self.body = bytearray()
        self.keys = [join_key(self.base_id, i) for i in range(engine_request_count(self.operation, body))]
        self.writer.bind(self.keys, self.trace.trace_id, self._bounded(self.headers.get(TASK_HEADER)))
        self._served(body)

    def _served(self, body: dict[str, Any]) -> None:
        w, trace = self.writer, self.trace
        stream = body.get("stream") is True
        flags = (ServedFlag.STREAM if stream else 0) | (ServedFlag.TRACEPARENT_INVALID if trace.invalid else 0)
        if trace.parent_span_id:
            flags |= ServedFlag.REMOTE_PARENT | (ServedFlag.PARENT_SAMPLED if trace.sampled else 0)
        limit = (1 << 32) - 1
        max_tokens = _integer(body, "max_completion_tokens", -1, 0, limit)
        if max_tokens < 0:
            max_tokens = _integer(body, "max_tokens", _DEFAULT_MAX_TOKENS[self.operation], 0, limit)
        user = body.get("user") if isinstance(body.get("user"), str) else None
        texts = {TextField.SESSION_ID: self._bounded(self.headers.get(SESSION_HEADER)),
                 TextField.USER_ID: self._bounded(self.headers.get(USER_HEADER) or user),
                 TextField.TRACESTATE: trace.tracestate}
        if w.settings.export_content:
            prompt = body.get("messages") if self.operation is Operation.CHAT else body.get("prompt")
            texts[TextField.PROMPT] = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False)
        for key in self.keys:
            w.write_records([(RecordKind.SERVED, (
                key, self.receive_ns, trace.parent_span_id, _number(body, "temperature", math.nan),
                _number(body, "top_p", math.nan), _integer(body, "top_k", -1, -1, (1 << 63) - 1),
                _integer(body, "seed", -1, -(1 << 63), (1 << 63) - 1), max_tokens, int(self.operation), int(flags)))])
            for text_field, text in texts.items():
                if text:
                    w.texts.text(key, text_field, text)

    def on_sent(self, message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            self.last_byte_ns = time.monotonic_ns()
            self.first_byte_ns = self.first_byte_ns or self.last_byte_ns

    def done(self) -> None:
        """After the app returned: NETWORK for each engine request the call described."""
        end = time.monotonic_ns()
        for key in self.keys:
            self.writer.texts.network(key, self.receive_ns, self.first_byte_ns or end, self.last_byte_ns or end)


class InfersightMiddleware:
    """ASGI middleware (``--middleware infersight.vllm.middleware.InfersightMiddleware``).
    ``writer``: for tests; vLLM constructs it with the app only, and it uses the process's writer."""

    def __init__(self, app: ASGIApp, writer: VllmRingWriter | None = None) -> None:
        self.app = app
        self.writer = writer if writer is not None else process_writer()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        operation = OPERATIONS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if operation is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        writer = self.writer
        try:
            call = _Call(scope, operation, writer)
        except Exception as exc:  # noqa: BLE001 -- observing must never break serving
            writer.fail("reading a request's headers", exc)
            await self.app(scope, receive, send)
            return

        async def observed_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                try:
                    call.on_body(message)
                except Exception as exc:  # noqa: BLE001
                    writer.fail("describing a request", exc)
            return message

        async def observed_send(message: Message) -> None:
            await send(message)
            call.on_sent(message)

        try:
            await self.app(call.scope, observed_receive, observed_send)
        finally:
            try:
                call.done()
            except Exception as exc:  # noqa: BLE001
                writer.fail("writing a request's network record", exc)
