"""Content-Encoding at the door (infersight.http.limits + http.inflate): a gzip'd or deflated JSON body
is decoded within max_body_bytes before its nesting is scanned, and the app reads the decoded body
(the one that was scanned). A bomb is a 413 without its decoded size ever being allocated; a coding
we cannot read is a 415; a broken stream a 400; protobuf bodies pass untouched (their app decodes
them). Expected bodies and sizes come from the bytes built here, compressed with Python's gzip/zlib."""
from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from collections.abc import Iterator

import httpx
import pytest
from asgi_server import running
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from infersight.http.inflate import EncodingRefused, decode_body
from infersight.http.limits import HttpLimits, LimitedApp
from infersight.tracing.receiver import OtlpReceiver

LIMITS = HttpLimits(max_body_bytes=1000, max_json_depth=8)
DEEP = b"[" * 9 + b"]" * 9  # one level over the limit
OK_DOC = {"a": [[[[[[["seven deep"]]]]]]], "pad": "x" * 300}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    rejected: list[tuple[str, str]] = []

    async def echo(request: Request) -> Response:
        body = await request.body()
        parse = request.headers.get("content-type", "") == "application/json"
        return JSONResponse({"bytes": len(body), "encoding": request.headers.get("content-encoding"),
                             "length": request.headers.get("content-length"),
                             "json": json.loads(body) if parse else None})

    app = LimitedApp(Starlette(routes=[Route("/echo", echo, methods=["POST"])]), LIMITS,
                     on_reject=lambda reason, message: rejected.append((reason, message)))
    with running(app, **LIMITS.uvicorn_options()) as (url, _):
        yield url, rejected


def post(url: str, body: bytes, encoding: str, media: str = "application/json") -> httpx.Response:
    return httpx.post(url + "/echo", content=body, headers={"content-type": media, "content-encoding": encoding},
                      timeout=10)


def test_gzip_deep_json_is_refused_like_plain_deep_json(server) -> None:  # noqa: ANN001
    url, rejected = server
    for encoding, body in (("gzip", gzip.compress(DEEP)), ("deflate", zlib.compress(DEEP)),
                           ("x-gzip", gzip.compress(DEEP)), ("GZIP", gzip.compress(DEEP))):
        resp = post(url, body, encoding)
        assert resp.status_code == 400, encoding
        assert resp.json() == {"error": "request body nests JSON deeper than 8 levels"}
        assert rejected[-1][0] == "json_too_deep"
    # brackets hidden in a second gzip member are found too (gzip.decompress reads every member)
    two = gzip.compress(b'{"a": 1}') + gzip.compress(DEEP)
    assert gzip.decompress(two) == b'{"a": 1}' + DEEP
    assert post(url, two, "gzip").status_code == 400


def test_gzip_json_within_limits_reaches_the_app_decoded(server) -> None:  # noqa: ANN001
    url, _ = server
    raw = json.dumps(OK_DOC).encode()
    resp = post(url, gzip.compress(raw), "gzip")
    assert resp.status_code == 200
    assert resp.json() == {"bytes": len(raw), "encoding": None, "length": str(len(raw)), "json": OK_DOC}


def test_a_gzip_bomb_is_413(server) -> None:  # noqa: ANN001
    url, rejected = server
    bomb = gzip.compress(b" " * 5_000_000)  # ~5 KB over the wire... too big for the 1,000-byte body limit
    small_bomb = gzip.compress(b"[" + b" " * 50_000 + b"]")  # 50 KB of JSON in ~100 bytes
    assert len(small_bomb) < 1000 < len(bomb)
    resp = post(url, small_bomb, "gzip")
    assert resp.status_code == 413 and resp.json() == {"error": "request body inflates beyond 1000 bytes"}
    assert rejected[-1][0] == "body_too_large"
    assert post(url, bomb, "gzip").status_code == 413  # refused by its own size, before any decoding


def test_unknown_and_broken_encodings(server) -> None:  # noqa: ANN001
    url, rejected = server
    resp = post(url, b"\x0b\x02\x80{}\x03", "br")
    assert resp.status_code == 415 and "content-encoding 'br' is not supported" in resp.json()["error"]
    assert rejected[-1][0] == "unsupported_encoding"
    assert post(url, gzip.compress(b"{}"), "gzip, br").status_code == 415  # stacked codings: not read
    for broken in (b"\x1f\x8b not gzip", gzip.compress(b'{"a": 1}')[:-6]):
        resp = post(url, broken, "gzip")
        assert resp.status_code == 400 and resp.json()["error"].startswith("request body is not valid gzip")
        assert rejected[-1][0] == "invalid_encoding"
    assert post(url, gzip.compress(b"{}") + b"junk", "gzip").status_code == 400
    assert gzip.decompress(b"") == b"" and post(url, b"", "gzip", "text/plain").json()["bytes"] == 0  # no member
    padded = gzip.compress(b"[1]") + b"\0" * 7 + gzip.compress(b"[2]") + b"\0" * 3  # zero padding, as gzip reads it
    assert gzip.decompress(padded) == b"[1][2]" and post(url, padded, "gzip", "text/plain").json()["bytes"] == 6


def test_protobuf_bodies_pass_through_encoded(server) -> None:  # noqa: ANN001
    url, _ = server
    body = gzip.compress(b"[" * 500)
    resp = post(url, body, "gzip", "application/x-protobuf")
    assert resp.status_code == 200
    assert resp.json()["bytes"] == len(body) and resp.json()["encoding"] == "gzip"


def test_decode_body_never_allocates_the_bomb() -> None:
    bomb = gzip.compress(b"\x00" * (256 << 20))  # 256 MiB in ~250 KB
    tracemalloc.start()
    try:
        with pytest.raises(EncodingRefused) as info:
            decode_body(bomb, "gzip", 1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.status == 413
    assert peak < 4 << 20  # the 1 MiB bound and zlib's window, not 256 MiB
    assert decode_body(gzip.compress(b"x" * 1000), "gzip", 1000) == b"x" * 1000  # the bound itself is allowed


def test_otlp_receiver_scans_gzip_json_and_counts_it() -> None:
    got: list[object] = []
    rec = OtlpReceiver(got.extend, ("127.0.0.1", 0), None, max_body_bytes=4096)
    rec.start()
    try:
        url = f"http://127.0.0.1:{rec.http_port}/v1/traces"
        deep = b'{"resourceSpans": ' + b"[" * 3000 + b"]" * 3000 + b"}"
        headers = {"content-type": "application/json", "content-encoding": "gzip"}
        resp = httpx.post(url, content=gzip.compress(deep), headers=headers, timeout=10)
        assert resp.status_code == 400
        assert resp.json() == {"code": 3, "message": "request body nests JSON deeper than 100 levels"}
        bomb = httpx.post(url, content=gzip.compress(b" " * 100_000), headers=headers, timeout=10)
        assert bomb.status_code == 413 and bomb.json()["code"] == 8
        empty = json.dumps({"resourceSpans": []}).encode()
        assert httpx.post(url, content=gzip.compress(empty), headers=headers, timeout=10).status_code == 200
        assert rec.counts.bodies_rejected[("http", "malformed")] == 1
        assert rec.counts.bodies_rejected[("http", "too_large")] == 1
    finally:
        rec.stop()
