"""infersight.http.limits on a real uvicorn: body size (413), JSON nesting (400), slow bodies and
slow headers (408), malformed and oversized requests (400/431), and JSON bodies for the errors an
app answers in plain text (404, 405, 500). Expected bodies are written out here, from the limits'
configured numbers; timings are checked against this process's own clock."""
from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from asgi_server import read_until_closed, running, split_response
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from infersight.http.limits import HttpLimits, LimitedApp, json_nesting_exceeds

#: asyncio runs a timer up to its clock resolution early (BaseEventLoop._run_once); seen: 0.5995 s for 0.6.
EARLY = 0.01
LIMITS = HttpLimits(max_body_bytes=1000, max_header_bytes=2048, max_json_depth=8, header_timeout_s=0.6,
                    body_timeout_s=0.6)


def build(rejected: list[tuple[str, str]]) -> LimitedApp:
    async def echo(request: Request) -> Response:
        body = await request.body()
        parse = body and request.headers.get("content-type", "") == "application/json"
        return JSONResponse({"bytes": len(body), "json": json.loads(body) if parse else None})

    async def boom(request: Request) -> Response:
        raise RuntimeError("a bug in a handler")

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/boom", boom)])
    return LimitedApp(app, LIMITS, on_reject=lambda reason, message: rejected.append((reason, message)))


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int, list[tuple[str, str]]]]:
    rejected: list[tuple[str, str]] = []
    with running(build(rejected), **LIMITS.uvicorn_options()) as (url, port):
        yield url, port, rejected


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def test_body_within_limits_passes_through(server) -> None:  # noqa: ANN001
    url, _, _ = server
    nested = [[[[[[[["deep enough"]]]]]]]]  # 8 levels: the limit itself
    resp = httpx.post(url + "/echo", json={"x": "[[[[[[[[[[[[", "y": nested[0]}, timeout=10)
    assert resp.status_code == 200 and resp.json()["json"]["y"] == nested[0]
    resp = httpx.post(url + "/echo", content=b"[" * 50, headers={"content-type": "application/x-protobuf"})
    assert resp.status_code == 200 and resp.json()["bytes"] == 50  # not JSON: not scanned (the app parses it)


def test_body_too_large_is_413_json(server) -> None:  # noqa: ANN001
    url, _, rejected = server
    before = len(rejected)
    resp = httpx.post(url + "/echo", content=b"x" * 1001, timeout=10)
    assert resp.status_code == 413 and resp.json() == {"error": "request body exceeds 1000 bytes"}
    assert resp.headers["connection"] == "close"

    def chunks() -> Iterator[bytes]:  # no content-length: counted as it arrives
        for _ in range(5):
            yield b"y" * 300
    resp = httpx.post(url + "/echo", content=chunks(), timeout=10)
    assert resp.status_code == 413 and resp.json() == {"error": "request body exceeds 1000 bytes"}
    assert [r for r, _ in rejected[before:]] == ["body_too_large", "body_too_large"]


def test_deep_json_is_400_before_parsing(server) -> None:  # noqa: ANN001
    url, _, rejected = server
    resp = httpx.post(url + "/echo", content=b"[" * 9 + b"]" * 9, timeout=10)
    assert resp.status_code == 400 and resp.json() == {"error": "request body nests JSON deeper than 8 levels"}
    assert rejected[-1][0] == "json_too_deep"
    resp = httpx.post(url + "/echo", content=b"[" * 999, timeout=10)  # would be a RecursionError at 1,000+
    assert resp.status_code == 400


def test_plain_text_errors_become_json(server) -> None:  # noqa: ANN001
    url, _, _ = server
    missing = httpx.get(url + "/nowhere", timeout=10)
    assert missing.status_code == 404 and missing.json() == {"error": "Not Found"}
    wrong = httpx.get(url + "/echo", timeout=10)
    assert wrong.status_code == 405 and wrong.json() == {"error": "Method Not Allowed"}
    assert wrong.headers["allow"] == "POST"  # the app's other headers are kept
    crash = httpx.get(url + "/boom", timeout=10)
    assert crash.status_code == 500 and crash.json() == {"error": "Internal Server Error"}
    assert crash.headers["content-type"] == "application/json"
    assert httpx.post(url + "/echo", json={}, timeout=10).status_code == 200  # and it keeps serving


def test_slow_headers_get_408_at_the_deadline(server) -> None:  # noqa: ANN001
    _, port, _ = server
    with connect(port) as sock:
        start = time.monotonic()
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\n")
        for ch in b"x-slow: 1234567890":  # a byte every 50 ms: each one would reset uvicorn's own timer
            try:
                sock.sendall(bytes([ch]))
            except OSError:
                break
            time.sleep(0.05)
        raw, closed = read_until_closed(sock, 5)
    status, headers, body = split_response(raw)
    assert status == 408 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"error": "request headers not received within 0.6 s"}
    assert 0.6 - EARLY <= closed - start < 2.5


def test_silent_connection_is_closed_at_the_deadline(server) -> None:  # noqa: ANN001
    _, port, _ = server
    with connect(port) as sock:
        start = time.monotonic()
        raw, closed = read_until_closed(sock, 5)
    assert raw == b"" and 0.6 - EARLY <= closed - start < 2.5


def test_slow_body_is_408(server) -> None:  # noqa: ANN001
    _, port, rejected = server
    with connect(port) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n12345")
        raw, _ = read_until_closed(sock, 5)
    status, _, body = split_response(raw)
    assert status == 408 and json.loads(body) == {"error": "request body not received within 0.6 s"}
    assert rejected[-1][0] == "body_timeout"


def test_malformed_and_oversized_requests_are_json(server) -> None:  # noqa: ANN001
    _, port, _ = server
    with connect(port) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        status, headers, body = split_response(read_until_closed(sock, 5)[0])
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"error": "Invalid HTTP request received."}
    big = b"GET /echo HTTP/1.1\r\nhost: x\r\nx-big: " + b"y" * 4096 + b"\r\n\r\n"
    with connect(port) as sock:  # in one piece h11 parses it: the app-side bound answers
        sock.sendall(big)
        status, _, body = split_response(read_until_closed(sock, 5)[0])
    assert status == 431 and json.loads(body) == {"error": "request headers exceed 2048 bytes"}
    with connect(port) as sock:  # in pieces h11's buffer bound trips first: the protocol answers the same
        for off in range(0, len(big), 1024):
            try:
                sock.sendall(big[off:off + 1024])
            except OSError:
                break
            time.sleep(0.02)
        status, _, body = split_response(read_until_closed(sock, 5)[0])
    assert status == 431 and json.loads(body) == {"error": "request headers exceed 2048 bytes"}


def test_keep_alive_still_works_and_rearms_the_deadline(server) -> None:  # noqa: ANN001
    url, _, _ = server
    with httpx.Client(base_url=url, timeout=10) as client:
        first = client.post("/echo", json=[1])
        time.sleep(0.8)  # past the header deadline, within keep-alive: the next request is a new one
        second = client.post("/echo", json=[2])
    assert first.json()["json"] == [1] and second.json()["json"] == [2]


def test_nesting_scan_counts_only_structure() -> None:
    assert not json_nesting_exceeds(b'{"a": "[[[[[[[[[[", "b": [[1]]}', 3)
    assert json_nesting_exceeds(b'{"a": [{"b": [[]]}]}', 4)
    assert not json_nesting_exceeds(b'{"a": [{"b": [[]]}]}', 5)
    assert not json_nesting_exceeds(b'["\\\\", "\\"[[[[", []]', 2)  # escaped quotes and backslashes
    assert json_nesting_exceeds(b"[" * 100_000, 64)


def test_slow_headers_of_a_second_request_on_a_kept_alive_connection(server) -> None:  # noqa: ANN001
    _, port, _ = server
    with connect(port) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n[]")
        time.sleep(0.3)  # the first answer arrives; the connection stays open
        start = time.monotonic()
        for ch in b"POST /echo HTTP/1.1\r\nhost: x\r\nx-slow: 0123456789":
            try:
                sock.sendall(bytes([ch]))
            except OSError:
                break
            time.sleep(0.04)
        raw, closed = read_until_closed(sock, 5)
    first, _, rest = raw.partition(b'{"bytes":2,"json":[]}')
    assert split_response(first)[0] == 200
    status, _, body = split_response(rest)
    assert status == 408 and json.loads(body) == {"error": "request headers not received within 0.6 s"}
    assert 0.6 - EARLY <= closed - start < 2.5


def test_a_bare_asgi_app_that_raises_gets_a_json_500() -> None:
    """No Starlette in between (no ServerErrorMiddleware): the limits themselves answer."""
    async def bare(scope, receive, send) -> None:  # noqa: ANN001
        if scope["type"] == "http":
            raise ValueError("broken before any answer")

    with running(LimitedApp(bare, LIMITS), **LIMITS.uvicorn_options()) as (url, _):
        resp = httpx.get(url + "/anything", timeout=10)
    assert resp.status_code == 500 and resp.json() == {"error": "Internal Server Error"}
