"""The connection bound (infersight.http.connections, through http.limits' protocol): a server holding
max_connections answers the next connection 503 with a JSON body and closes it, counts it, and
serves again once a place is free. The held connections are raw sockets opened here (idle, or
with a half-sent request), so the expected counts are the test's own. Also on `infersight serve`'s
/metrics and the OTLP receiver's counters."""
from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from asgi_server import read_until_closed, running, split_response
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from infersight.http.connections import ConnectionGate
from infersight.http.limits import HttpLimits, LimitedApp
from infersight.tracing.receiver import OtlpReceiver

MAX = 3
LIMITS = HttpLimits(max_connections=MAX, header_timeout_s=30)


async def ok(request: Request) -> Response:
    return JSONResponse({"ok": True})


@pytest.fixture()
def gated() -> Iterator[tuple[str, int, ConnectionGate]]:
    gate = ConnectionGate(MAX, "test")
    app = LimitedApp(Starlette(routes=[Route("/", ok)]), LIMITS)
    with running(app, **LIMITS.uvicorn_options(gate=gate)) as (url, port):
        yield url, port, gate


def wait_for(predicate, timeout: float = 5.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@contextmanager
def held(port: int, n: int, gate: ConnectionGate) -> Iterator[None]:
    """n connections that stay open (the first idle, the others with a request line sent and no
    more) until the block ends; the server has counted them all when it starts."""
    socks = []
    try:
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i:
                s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n")
            socks.append(s)
        wait_for(lambda: gate.open == n)
        yield
    finally:
        for s in socks:
            s.close()


def test_one_connection_over_the_bound_gets_503_json_and_is_counted(gated) -> None:  # noqa: ANN001
    url, port, gate = gated
    with held(port, MAX, gate):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
            start = time.monotonic()
            extra.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            raw, closed = read_until_closed(extra, 5)
        status, headers, body = split_response(raw)
        assert status == 503 and headers["content-type"] == "application/json"
        assert headers["connection"] == "close" and headers["retry-after"] == "1"
        assert json.loads(body) == {"error": f"the server holds {MAX} connections (--max-connections); retry later"}
        assert closed - start < 2.0
        resp = httpx.get(url + "/", timeout=5)  # httpx's own connection: refused the same way
        assert resp.status_code == 503 and resp.json()["error"].startswith("the server holds 3 connections")
        assert (gate.refused, gate.open) == (2, MAX)
    wait_for(lambda: gate.open == 0)
    assert httpx.get(url + "/", timeout=5).json() == {"ok": True}  # places free again: served
    assert gate.refused == 2


def test_a_refused_client_that_sends_nothing_is_answered_within_a_second(gated) -> None:  # noqa: ANN001
    _, port, gate = gated
    with held(port, MAX, gate), socket.create_connection(("127.0.0.1", port), timeout=5) as silent:
        start = time.monotonic()
        raw, closed = read_until_closed(silent, 5)
    assert split_response(raw)[0] == 503 and 0.9 <= closed - start < 3.0


def test_gate_collector_and_bounds() -> None:
    gate = ConnectionGate(2, "serve")
    assert [gate.admit() for _ in range(4)] == [True, True, False, False]
    gate.release()
    assert gate.admit() is True
    reg = CollectorRegistry()
    reg.register(gate.collector())
    assert reg.get_sample_value("infersight_http_connections_refused_total", {"server": "serve"}) == 2
    assert reg.get_sample_value("infersight_http_connections_open", {"server": "serve"}) == 2
    with pytest.raises(ValueError):
        ConnectionGate(0)
    with pytest.raises(ValueError):
        HttpLimits(max_connections=0)


def test_otlp_receiver_refuses_and_counts_connections_over_its_bound() -> None:
    rec = OtlpReceiver(lambda spans: None, ("127.0.0.1", 0), None, max_connections=2)
    rec.start()
    try:
        with held(rec.http_port, 2, rec.gate):
            resp = httpx.post(f"http://127.0.0.1:{rec.http_port}/v1/traces", content=b"",
                              headers={"content-type": "application/x-protobuf"}, timeout=5)
        assert resp.status_code == 503 and resp.json()["code"] == 14  # google.rpc UNAVAILABLE
        assert rec.counts.bodies_rejected[("http", "too_many_connections")] == 1
    finally:
        rec.stop()


def test_agent_listener_counts_its_refusals_on_its_registry() -> None:
    from infersight.agent.api.server import listener_options

    reg = CollectorRegistry()
    options = listener_options(5, reg)
    gate = options["http"].keywords["gate"]
    assert (gate.max_connections, gate.server) == (5, "agent")
    assert reg.get_sample_value("infersight_http_connections_refused_total", {"server": "agent"}) == 0
    for _ in range(6):
        gate.admit()
    assert reg.get_sample_value("infersight_http_connections_refused_total", {"server": "agent"}) == 1
