"""Limits every infersight HTTP server applies, whatever its routes: one ASGI middleware and one uvicorn
protocol, so a careless or hostile client costs its answer and a count, never the server.

    socket ─> GuardedH11Protocol ──────────────> LimitedApp ───────────────────────> the app
              over max_connections -> 503;        content-length > max -> 413;
              headers: byte bound (h11), a
              deadline from the first byte        body read with a deadline -> 408,
              (slow headers -> 408, closed);      counted -> 413; gzip/deflate decoded
                                                  within max_body_bytes and the work
                                                  bounds (a bomb, a member flood -> 413,
                                                  other codings -> 415); JSON nesting -> 400
                                                  (large or encoded bodies: in a thread);
              malformed -> 400/431 JSON           errors the app answers in plain text
              Upgrade ignored: plain HTTP         (404, 405, 500) re-sent as JSON;
                                                  an exception -> 500 JSON; a WebSocket
                                                  scope -> JSON 404 (routes_app: no
                                                  trailing-slash redirects)

The protocol is in protocol.py (re-exported here), the connection bound in connections.py,
the bounded decoding of gzip/deflate bodies in inflate.py.

Each server renders its own error bodies (OpenAI-style for `infersight serve`, {"error": ...} for
the agent, a google.rpc.Status for the OTLP receiver) through an ErrorRender, and counts refusals
through an optional on_reject(reason, message).
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import anyio.to_thread
from starlette.applications import Starlette
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infersight.http.connections import ConnectionGate
from infersight.http.inflate import DEFAULT_BOUNDS, EncodingRefused, InflateBounds, decode_body, is_identity
from infersight.http.protocol import ErrorRender, GuardedH11Protocol, phrase as _phrase, simple_error_body

__all__ = ["HttpLimits", "LimitedApp", "LimitExceeded", "ErrorRender", "RejectHook", "GuardedH11Protocol",
           "simple_error_body", "grpc_status_error_body", "json_nesting_exceeds", "routes_app", "RECEIVED_NS"]

log = logging.getLogger("infersight.http")

#: (reason, message): called once for each request the limits refuse.
RejectHook = Callable[[str, str], None]

# A JSON string literal, escapes included (possessive: linear; DOTALL: a backslash before a newline is
# one escape, so brackets after it are not taken for string content).
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_OPENERS = frozenset(b"[{")
_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")  # everything but brackets, for bytes.translate
_SKIP_DEPTH_TYPES = ("application/x-protobuf", "application/protobuf", "application/grpc")
#: Scope key: time.monotonic_ns() when the request reached LimitedApp, before its body was read (the
#: app's handler starts only after, so a server timing the request from its arrival reads this).
RECEIVED_NS = "infersight.received_ns"
#: Plain bodies up to this size are scanned in the event loop (well under a millisecond); larger or
#: encoded ones in a worker thread.
_INLINE_SCAN_BYTES = 64 << 10


@dataclass(frozen=True)
class HttpLimits:
    """The bounds, validated when built. max_json_depth: arrays and objects nested deeper are refused
    before any parser recurses (Python's json raises RecursionError near 1,000)."""

    max_body_bytes: int = 1 << 20
    max_header_bytes: int = 16 << 10
    max_json_depth: int = 64
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_connections: int = 256  # open at once; one more is answered 503 and closed (http.connections)
    inflate: InflateBounds = DEFAULT_BOUNDS  # the work a gzip/deflate body may cost (http.inflate)

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes", "max_json_depth", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def uvicorn_options(self, render: ErrorRender | None = None, gate: ConnectionGate | None = None
                        ) -> dict[str, Any]:
        """Keyword arguments for uvicorn.Config: the guarded h11 protocol (its own errors rendered by
        `render`, the same as the app's), its header bound, and the connection bound: `gate` (pass one
        to count its refusals on /metrics; otherwise one of max_connections is made here)."""
        gate = gate if gate is not None else ConnectionGate(self.max_connections)
        protocol = functools.partial(GuardedH11Protocol, header_timeout_s=self.header_timeout_s,
                                     render=render or simple_error_body, gate=gate)
        return {"http": protocol, "ws": "none", "h11_max_incomplete_event_size": self.max_header_bytes,
                "timeout_keep_alive": self.keep_alive_s}


#: google.rpc.Code of each HTTP status the limits answer (OTLP/HTTP's error body is a google.rpc.Status).
_GRPC_CODES = {400: 3, 404: 5, 405: 12, 408: 4, 413: 8, 415: 3, 431: 8, 500: 13, 503: 14}


def grpc_status_error_body(status: int, message: str, reason: str) -> dict[str, Any]:
    """{"code": google.rpc.Code, "message": ...}: a google.rpc.Status in JSON (the OTLP receiver's)."""
    return {"code": _GRPC_CODES.get(status, 2), "message": message}


def routes_app(routes: Sequence[BaseRoute]) -> Starlette:
    """A Starlette app of `routes` that never redirects. Starlette's router answers a path with a
    trailing slash too many (or too few) with a 307 to an absolute URL built from the request's Host
    header, which the client chooses (`Host: evil.example` came back as `Location: http://evil.example/`);
    here such a path is a 404 like any other unknown one (JSON, through LimitedApp)."""
    app = Starlette(routes=list(routes))
    app.router.redirect_slashes = False  # Starlette() takes no such argument; its Router does
    return app


def json_nesting_exceeds(body: bytes, max_depth: int) -> bool:
    """Whether arrays/objects in `body` nest deeper than max_depth (brackets inside strings do not
    count). Cheap when the body has few brackets; one pass over them otherwise."""
    if body.count(b"[") + body.count(b"{") <= max_depth:
        return False
    depth = 0
    for c in _STRING.sub(b"", body).translate(None, _BRACKETS):
        if c in _OPENERS:
            depth += 1
            if depth > max_depth:
                return True
        else:
            depth -= 1
    return False


class LimitExceeded(Exception):
    """A request refused by the limits: status, message, and the reason it is counted under."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


class LimitedApp:
    """ASGI middleware: the header, body and JSON-nesting bounds, and JSON bodies on every error.

    The body is read here (bounded, with a deadline) and replayed to the app; after it, the app's
    receive() is the server's, so disconnects still reach it."""

    def __init__(self, app: ASGIApp, limits: HttpLimits, render: ErrorRender = simple_error_body,
                 on_reject: RejectHook | None = None) -> None:
        self.app, self.limits, self.render, self.on_reject = app, limits, render, on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._refuse_websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[RECEIVED_NS] = time.monotonic_ns()
        try:
            body = await self._read(scope, receive)
        except LimitExceeded as exc:
            if self.on_reject is not None:
                self.on_reject(exc.reason, exc.message)
            await self._answer(send, exc.status, exc.message, exc.reason, close=True)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        guard = _JsonErrors(send, self)
        try:
            await self.app(scope, replay, guard.send)
        except Exception as exc:  # noqa: BLE001 -- the client gets a JSON 500; the log gets the traceback
            log.error("%s %s failed: %s: %s", scope.get("method"), scope.get("path"), type(exc).__name__, exc,
                      exc_info=exc)
            if not guard.started:
                await self._answer(send, 500, _phrase(500), "internal_error")
            elif not guard.finished:
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _refuse_websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """No infersight app serves WebSocket (uvicorn_options turns it off; this holds under a server
        that does not): a JSON 404 through ASGI's denial response where the server offers it, else a close."""
        await receive()  # websocket.connect
        message = "WebSocket is not served here"
        if self.on_reject is not None:
            self.on_reject("websocket_refused", message)
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": message})
            return
        data = json.dumps(self.render(404, message, "websocket_refused")).encode()
        await send({"type": "websocket.http.response.start", "status": 404, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "websocket.http.response.body", "body": data})

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        lim = self.limits
        headers = scope["headers"]
        if sum(len(k) + len(v) for k, v in headers) > lim.max_header_bytes:
            raise LimitExceeded(431, f"request headers exceed {lim.max_header_bytes} bytes", "headers_too_large")
        declared = _header(headers, b"content-length")
        if declared.isdigit() and int(declared) > lim.max_body_bytes:
            raise LimitExceeded(413, f"request body exceeds {lim.max_body_bytes} bytes", "body_too_large")
        try:
            body = await asyncio.wait_for(self._body(receive), lim.body_timeout_s)
        except asyncio.TimeoutError:
            raise LimitExceeded(408, f"request body not received within {lim.body_timeout_s:g} s",
                                "body_timeout") from None
        media = _header(headers, b"content-type").split(";")[0].strip().lower()
        if media in _SKIP_DEPTH_TYPES:  # protobuf: the app decodes it (and its encoding) with its own bounds
            return body
        encoding = _header(headers, b"content-encoding")
        if is_identity(encoding) and len(body) <= _INLINE_SCAN_BYTES:
            return self._checked(body, encoding)
        # Decoding and scanning a large or encoded body is milliseconds of CPU at best: in a worker
        # thread, so the event loop goes on answering other requests meanwhile (zlib and the scan's
        # C parts release the GIL; the Python parts share it at the interpreter's switch interval).
        body = await anyio.to_thread.run_sync(self._checked, body, encoding)
        if not is_identity(encoding):  # handed on decoded: the app parses what was scanned
            scope["headers"] = [(k, v) for k, v in headers if k.lower() not in (b"content-encoding", b"content-length")]
            scope["headers"].append((b"content-length", str(len(body)).encode()))
        return body

    def _checked(self, body: bytes, encoding: str) -> bytes:
        """The body decoded (within the size and work bounds) and its JSON nesting scanned; thread-safe."""
        lim = self.limits
        if not is_identity(encoding):  # scanned decoded: a gzip'd body would hide its brackets
            try:
                body = decode_body(body, encoding, lim.max_body_bytes, lim.inflate)
            except EncodingRefused as exc:
                raise LimitExceeded(exc.status, exc.message, exc.reason) from None
        if json_nesting_exceeds(body, lim.max_json_depth):
            raise LimitExceeded(400, f"request body nests JSON deeper than {lim.max_json_depth} levels",
                                "json_too_deep")
        return body

    async def _body(self, receive: Receive) -> bytes:
        buf = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise LimitExceeded(400, "the client closed the connection", "client_disconnected")
            buf += message.get("body", b"")
            if len(buf) > self.limits.max_body_bytes:
                raise LimitExceeded(413, f"request body exceeds {self.limits.max_body_bytes} bytes",
                                    "body_too_large")
            if not message.get("more_body", False):
                return bytes(buf)

    async def _answer(self, send: Send, status: int, message: str, reason: str, close: bool = False,
                      extra: list[tuple[bytes, bytes]] | None = None) -> None:
        data = json.dumps(self.render(status, message, reason)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        if close:  # the rest of a refused body is never read: the connection cannot be reused
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
        await send({"type": "http.response.body", "body": data, "more_body": False})


class _JsonErrors:
    """A send() that re-sends the app's non-JSON error answers (Starlette's plain-text 404, 405, 500)
    as JSON, keeping their other headers (Allow, WWW-Authenticate)."""

    def __init__(self, send: Send, owner: LimitedApp) -> None:
        self._send, self._owner = send, owner
        self.started = self.finished = False  # as the client sees it: a held-back start is not started
        self._rewrite: tuple[int, list[tuple[bytes, bytes]]] | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            status, headers = message["status"], list(message.get("headers", []))
            media = _header(headers, b"content-type").lower()
            if status >= 400 and (not media or media.startswith("text/")):
                kept = [(k, v) for k, v in headers if k.lower() not in (b"content-type", b"content-length")]
                self._rewrite = (status, kept)
                return
            self.started = True
        elif message["type"] == "http.response.body" and self._rewrite is not None:
            if not message.get("more_body", False):
                status, kept = self._rewrite
                phrase = _phrase(status)
                self.started = self.finished = True
                await self._owner._answer(self._send, status, phrase, phrase.lower().replace(" ", "_"), extra=kept)
            return
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        await self._send(message)


def _header(headers: Any, name: bytes) -> str:
    for k, v in headers:
        if k.lower() == name:
            return v.decode("latin-1")
    return ""


