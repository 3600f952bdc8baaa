"""uvicorn's h11 protocol, guarded: a header-read deadline, a bound on open connections, JSON
bodies on the errors it answers itself (400, 408, 431, 503), and HTTP/1.1 only. Built by
HttpLimits.uvicorn_options (infersight.http.limits), which the servers pass to uvicorn.Config.

No infersight server speaks WebSocket (or h2c), so an Upgrade header is ignored, as RFC 9110 §7.8 lets
a server do: the request is answered as plain HTTP, through the app and its JSON errors. uvicorn
would otherwise hand a WebSocket upgrade to its WebSocket protocol, which answered 403 with an empty
text/plain body and took the connection past this protocol's connection_lost, so the gate's slot
was never given back (each upgrade held one of --max-connections for good); any other Upgrade value
cost two warning lines per request.

uvicorn has no header-read timeout: its keep-alive timer is cancelled by every byte received, so a
client that sends its headers a byte at a time is held forever. GuardedH11Protocol starts one
deadline at the request's first byte (or the connection's start) and never extends it. A connection
over the ConnectionGate's bound is never parsed: its head is awaited (a second at most) and answered
503 (infersight.http.connections).
"""
from __future__ import annotations

import asyncio
import http
import json
from typing import Any, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from infersight.http.connections import REFUSED_WAIT_S, ConnectionGate, RefusedHead

#: (status, message, reason) -> the JSON body of an error answer.
ErrorRender = Callable[[int, str, str], Any]


def simple_error_body(status: int, message: str, reason: str) -> dict[str, Any]:
    """{"error": message} (the agent's error bodies)."""
    return {"error": message}


def phrase(status: int) -> str:
    """The reason phrase of an HTTP status ("HTTP 599" for one http.HTTPStatus does not know)."""
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header-read deadline and JSON bodies on its own 400/431.

    The deadline starts at the connection's start and again at the first byte of each later request
    (the keep-alive timer covers the idle wait between them); reaching it before the headers are
    complete answers 408 and closes."""

    def __init__(self, *args: Any, header_timeout_s: float = 10.0, render: ErrorRender | None = None,
                 gate: ConnectionGate | None = None, **kwargs: Any) -> None:  # noqa: D107
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.render = render or simple_error_body
        self.gate = gate
        self._admitted = False
        self._refused: RefusedHead | None = None  # set on a connection over the gate's bound
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.gate is not None and not self.gate.admit():
            self._refused = RefusedHead(self.config.h11_max_incomplete_event_size or (16 << 10))
            self._header_deadline = self.loop.call_later(REFUSED_WAIT_S, self._answer_refused)
            return
        self._admitted = self.gate is not None
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:  # never parsed: its head is awaited, then answered 503
            if self._refused.complete(data):
                self._answer_refused()
            return
        super().data_received(data)
        self._track()

    def _answer_refused(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            assert self.gate is not None
            self._raw_json(503, self.gate.refusal_message(), "too_many_connections", b"retry-after: 1\r\n")
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start the next (pipelined) request
        self._track()

    def _track(self) -> None:
        """Disarmed once a request's headers are in; armed when the next one has begun and they are not."""
        if self.conn.their_state is not h11.IDLE:
            self._disarm()
        elif self._header_deadline is None and self.conn.trailing_data[0]:
            self._arm()  # the first bytes of the next request on a kept-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._admitted:
            self._admitted = False
            self.gate.release()  # type: ignore[union-attr]
        super().connection_lost(exc)

    def _should_upgrade(self) -> bool:  # uvicorn's hook: never switch protocols, and say nothing
        return False

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a request arrived: say why it is closed
            self._raw_json(408, f"request headers not received within {self.header_timeout_s:g} s", "header_timeout")
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        buffered = len(self.conn.trailing_data[0])
        limit = self.config.h11_max_incomplete_event_size
        if limit is not None and buffered > limit:
            self._raw_json(431, f"request headers exceed {limit} bytes", "headers_too_large")
        else:
            self._raw_json(400, msg, "invalid_http")
        self.transport.close()

    def _raw_json(self, status: int, message: str, reason: str, extra: bytes = b"") -> None:
        # Written past h11: it refuses to answer a request it has not parsed.
        data = json.dumps(self.render(status, message, reason)).encode()
        head = (f"HTTP/1.1 {status} {phrase(status)}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(data)}\r\nconnection: close\r\n").encode("latin-1")
        self.transport.write(head + extra + b"\r\n" + data)
