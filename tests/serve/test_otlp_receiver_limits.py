"""The agent's OTLP/HTTP receiver behind infersight.http.limits: a deeply nested JSON body is a 400
with a google.rpc.Status JSON body, counted as malformed; a body over twice the receiver's limit is
refused before it is read (413, counted too_large); an unknown path is a JSON 404; a client that
never finishes its headers is answered 408 and closed. What the receiver itself answers (its own
413, 415, protobuf Status) is unchanged; its tests are in tests/tracing."""
from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from asgi_server import read_until_closed, split_response

from infersight.tracing.receiver import OtlpReceiver


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[OtlpReceiver, str]]:
    got: list[object] = []
    rec = OtlpReceiver(got.extend, ("127.0.0.1", 0), None, max_body_bytes=4096)
    rec.start()
    try:
        yield rec, f"http://127.0.0.1:{rec.http_port}"
    finally:
        rec.stop()


def rejected(rec: OtlpReceiver, reason: str) -> int:
    return rec.counts.bodies_rejected[("http", reason)]


def test_deep_json_is_400_status_and_counted(receiver) -> None:  # noqa: ANN001
    rec, url = receiver
    before = rejected(rec, "malformed")
    body = b'{"resourceSpans": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    resp = httpx.post(url + "/v1/traces", content=body, headers={"content-type": "application/json"}, timeout=10)
    assert resp.status_code == 400
    assert resp.json() == {"code": 3, "message": "request body nests JSON deeper than 100 levels"}
    assert rejected(rec, "malformed") == before + 1


def test_far_too_large_body_is_413_before_it_is_read(receiver) -> None:  # noqa: ANN001
    rec, url = receiver
    before = rejected(rec, "too_large")
    resp = httpx.post(url + "/v1/traces", content=b"\x00" * 10_000, timeout=10,
                      headers={"content-type": "application/x-protobuf"})
    assert resp.status_code == 413 and resp.json() == {"code": 8, "message": "request body exceeds 8192 bytes"}
    assert rejected(rec, "too_large") == before + 1


def test_unknown_path_and_method_are_json(receiver) -> None:  # noqa: ANN001
    _, url = receiver
    assert httpx.get(url + "/v1/metrics", timeout=10).json() == {"code": 5, "message": "Not Found"}
    assert httpx.get(url + "/v1/traces", timeout=10).json() == {"code": 12, "message": "Method Not Allowed"}


def test_slow_headers_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the receiver's limits but a 0.5 s header deadline (its own is 10 s: too slow for a test)."""
    real = OtlpReceiver.http_limits
    monkeypatch.setattr(OtlpReceiver, "http_limits", lambda self: replace(real(self), header_timeout_s=0.5))
    rec = OtlpReceiver(lambda spans: None, ("127.0.0.1", 0))
    rec.start()
    try:
        with socket.create_connection(("127.0.0.1", rec.http_port), timeout=5) as sock:
            start = time.monotonic()
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nhost: x\r\n")
            raw, closed = read_until_closed(sock, 5)
    finally:
        rec.stop()
    status, _, body = split_response(raw)
    assert status == 408 and json.loads(body) == {"code": 4, "message": "request headers not received within 0.5 s"}
    assert 0.5 <= closed - start < 2.5
    assert real(rec).header_timeout_s == 10.0  # what the agent runs with
