"""Every infersight HTTP server (`serve`, the agent, the OTLP receiver) on a real uvicorn, asked what a
browser or a hostile client asks (issue 33 items 6 and 7):

- a WebSocket upgrade got a 403 with an empty text/plain body, and handed the connection to uvicorn's
  WebSocket protocol, past the connection gate: each one held a slot of --max-connections for good,
  so a few upgrades locked every client out. Now an Upgrade header is ignored (RFC 9110 lets a server
  do so): the request is answered as plain HTTP, its errors in the server's JSON error shape;
- a path with a trailing slash was answered 307 with `Location: http://<the Host header>/...`, the
  client's Host reflected into a redirect. Now no app redirects: such a path is a JSON 404.

The expected error shapes are each server's own (OpenAI's for `serve`, {"error"} for the agent, a
google.rpc.Status for the receiver), written out here."""
from __future__ import annotations

import asyncio
import gzip
import json
import socket
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Callable

import pytest
from asgi_server import running, running_config, split_response
from prometheus_client import CollectorRegistry
from serve_fixtures import MODEL, Harness
from testkit import free_port

from infersight.agent.config import AgentConfig
from infersight.agent.api.server import AGENT_LIMITS, build_app as build_agent_app
from infersight.agent.state import AgentState
from infersight.http.limits import LimitedApp
from infersight.serve.api_error import openai_error_body
from infersight.serve.config import ServeConfig
from infersight.serve.runner import uvicorn_config
from infersight.tracing.receiver import OtlpReceiver

MAX_CONNECTIONS = 4
UPGRADE = ("Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")


def is_openai_error(body: Any) -> bool:
    return set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}


def is_agent_error(body: Any) -> bool:
    return set(body) == {"error"} and isinstance(body["error"], str)


def is_rpc_status(body: Any) -> bool:
    return set(body) == {"code", "message"} and isinstance(body["code"], int)


def exchange(port: int, request: str, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One raw request on a fresh connection; the response once its whole body is in."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request.encode("latin-1"))
        data = b""
        while True:
            chunk = sock.recv(65536)
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                status, headers, body = split_response(data)
                if len(body) >= int(headers.get("content-length", "0")):
                    return status, headers, body
            if not chunk:
                return split_response(data)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, tuple[int, str, Callable[[Any], bool]]]]:
    """name -> (port, a path it serves with GET, its error shape), each at MAX_CONNECTIONS connections."""
    with Harness(ServeConfig(model_name=MODEL)) as harness:
        served = ServeConfig(model_name=MODEL, host="127.0.0.1", port=free_port(), max_connections=MAX_CONNECTIONS)
        agent_app = build_agent_app(AgentState(AgentConfig(rings=["unused"])), CollectorRegistry(), None)
        receiver = OtlpReceiver(lambda spans: None, ("127.0.0.1", 0), None, max_connections=MAX_CONNECTIONS)
        receiver.start()
        try:
            with running_config(uvicorn_config(harness.app, served)), \
                    running(agent_app, **replace(AGENT_LIMITS, max_connections=MAX_CONNECTIONS).uvicorn_options()) \
                    as (_, agent_port):
                yield {"serve": (served.port, "/v1/models", is_openai_error),
                       "agent": (agent_port, "/api/v1/summary", is_agent_error),
                       "otlp_receiver": (receiver.http_port, "/v1/traces", is_rpc_status)}
        finally:
            receiver.stop()


NAMES = ("serve", "agent", "otlp_receiver")


@pytest.mark.parametrize("name", NAMES)
def test_a_websocket_upgrade_is_answered_as_http_with_a_json_error(servers, name: str) -> None:  # noqa: ANN001
    port, _, shape = servers[name]
    status, headers, body = exchange(port, f"GET /ws HTTP/1.1\r\nHost: x\r\n{UPGRADE}\r\n")
    assert status == 404  # before: 403 with an empty text/plain body
    assert headers["content-type"] == "application/json" and shape(json.loads(body))
    assert "upgrade" not in headers.get("connection", "").lower()


@pytest.mark.parametrize("name", ("serve", "agent"))
def test_an_upgrade_to_a_resource_gets_the_resource(servers, name: str) -> None:  # noqa: ANN001
    port, path, _ = servers[name]
    status, headers, body = exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n{UPGRADE}\r\n")
    assert status == 200 and headers["content-type"] == "application/json" and json.loads(body)


@pytest.mark.parametrize("name", NAMES)
def test_upgrades_do_not_hold_connection_slots(servers, name: str) -> None:  # noqa: ANN001
    """Twice the connection bound in upgrades, one after the other: the server still answers."""
    port, _, _ = servers[name]
    for _ in range(2 * MAX_CONNECTIONS):
        exchange(port, f"GET /ws HTTP/1.1\r\nHost: x\r\n{UPGRADE}\r\n")
    status, _, _ = exchange(port, "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 404  # before: 503, every slot held by a WebSocket connection nobody used


@pytest.mark.parametrize("name", NAMES)
def test_a_trailing_slash_is_a_json_404_and_the_host_header_is_not_reflected(servers, name: str) -> None:  # noqa: ANN001
    port, path, shape = servers[name]
    for method, target in (("GET", path + "/"), ("POST", path + "/"), ("GET", path + "//"), ("GET", path + "/?a=1")):
        request = f"{method} {target} HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 2\r\n\r\n{{}}"
        status, headers, body = exchange(port, request)
        assert status == 404, (method, target, status, headers)  # before: 307 to http://evil.example/...
        assert not any("evil.example" in value for value in headers.values()) and "location" not in headers
        assert headers["content-type"] == "application/json" and shape(json.loads(body))


def test_serve_refuses_a_member_flood_in_its_own_error_shape(servers) -> None:  # noqa: ANN001
    port, _, _ = servers["serve"]
    flood = gzip.compress(b"", mtime=0) * 50_000  # 1,000,000 bytes: within serve's 1 MiB body limit
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Encoding: gzip\r\nContent-Length: {len(flood)}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request.encode("latin-1") + flood)
        data = b""
        while b"\r\n\r\n" not in data or len(split_response(data)[2]) < int(split_response(data)[1]["content-length"]):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status, headers, body = split_response(data)
    assert status == 413 and json.loads(body) == openai_error_body(413, "request body has more than 1024 gzip "
                                                                         "members", "body_too_large")


def test_limited_app_refuses_a_websocket_scope_with_a_json_denial() -> None:
    """Under a server that does speak WebSocket, LimitedApp still answers in JSON (the ASGI denial
    response extension), or closes when the server offers no such extension; the app never sees it."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    for extensions, expect in (({"websocket.http.response": {}}, "websocket.http.response.start"),
                               ({}, "websocket.close")):
        sent: list[dict[str, Any]] = []
        messages = [{"type": "websocket.connect"}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "websocket", "path": "/ws", "headers": [], "extensions": extensions}
        asyncio.run(LimitedApp(app, AGENT_LIMITS, openai_error_body)(scope, receive, send))
        assert sent[0]["type"] == expect and seen == []
        if expect == "websocket.http.response.start":
            assert sent[0]["status"] == 404 and (b"content-type", b"application/json") in sent[0]["headers"]
            assert sent[1]["type"] == "websocket.http.response.body"
            assert is_openai_error(json.loads(sent[1]["body"]))
