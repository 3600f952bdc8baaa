"""Fuzzing the HTTP door's encoded-body path (http_limits.LimitedApp + http_inflate): gzip'd and deflated
JSON bodies, mutated before and after compression, through the real ASGI middleware in-process.

Each case either reaches the app or is answered with a JSON error of status 400, 413 or 415, never
another exception, hang or allocation storm. Checked against references that are not the code under
test: Python's gzip.decompress / zlib.decompress for what the body decodes to (the app must get
exactly that, and only when it fits the bound), and a naive character-by-character bracket count
for the nesting (nothing deeper than the limit reaches the app).
"""
from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any, Callable

from fuzzkit import INTERESTING, case_count, describe, fuzz, mutations
from infersight.http_limits import HttpLimits, LimitedApp

SEED = 4242
LIMITS = HttpLimits(max_body_bytes=4096, max_json_depth=8)
DOCS = [json.dumps(d).encode() for d in (
    {"prompt": "def f(x):", "max_tokens": 8, "stop": ["\n\n"], "n": [[[[1]]]]},
    {"messages": [{"role": "user", "content": "a [ { \" \\ b"}], "x": [[[[[[["seven"]]]]]]]},
    [1, 2.5, None, True, "\\ud800"],
)] + [b"[" * 9 + b"]" * 9, b'{"a": "' + b"x" * 3000 + b'"}']


class ReferenceError_(Exception):
    """The reference decoder could not decode the body."""


#: Where the door is stricter than Python's gzip module, as RFC 1952 allows or asks: it checks a
#: member's header CRC (FHCRC) and refuses reserved header flags; gzip.decompress skips both.
STRICTER = ("header crc mismatch", "unknown header flags set")


def reference_decode(body: bytes, encoding: str) -> bytes:
    """Python's own decoders. One rule is ours: bytes after a deflate stream, which zlib.decompress
    ignores, make the body invalid (the door refuses them rather than drop part of a body unsaid),
    as gzip.decompress does for bytes after the last gzip member. See also STRICTER."""
    try:
        if encoding == "deflate":
            inflater = zlib.decompressobj()
            out = inflater.decompress(body)
            if inflater.unused_data or not inflater.eof:
                raise ReferenceError_("data after the stream, or truncated")
            return out
        return gzip.decompress(body)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise ReferenceError_(str(exc)) from None


def naive_depth(body: bytes) -> tuple[int, bool]:
    """The deepest nesting of [ and { outside JSON strings, one character at a time, and whether the
    body ends inside a string (then the door, which strips only complete strings, counts more)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in body:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in b"]}":
            depth -= 1
    return deepest, in_string


async def through_door(body: bytes, encoding: str) -> tuple[int, bytes | None, bytes]:
    """(status, the body the app received or None, the response body)."""
    got: dict[str, Any] = {}

    async def app(scope: Any, receive: Callable, send: Callable) -> None:
        got["body"] = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [
        (b"content-type", b"application/json"), (b"content-encoding", encoding.encode()),
        (b"content-length", str(len(body)).encode())]}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await LimitedApp(app, LIMITS)(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, got.get("body"), b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def check(encoding: str) -> Callable[[bytes], None]:
    def decode(body: bytes) -> None:
        status, received, answer = asyncio.run(through_door(body, encoding))
        try:
            plain: bytes | None = reference_decode(body, encoding)
        except ReferenceError_:
            plain = None
        if received is not None:  # accepted: exactly the reference's bytes, within both bounds
            assert status == 200 and plain is not None and received == plain, (status, len(received))
            assert len(received) <= LIMITS.max_body_bytes and naive_depth(received)[0] <= LIMITS.max_json_depth
            return
        assert status in (400, 413, 415), status
        assert set(json.loads(answer)) == {"error"}
        if len(body) > LIMITS.max_body_bytes or (plain is not None and len(plain) > LIMITS.max_body_bytes):
            assert status == 413, status
        elif plain is None:
            assert status in (400, 413), status  # broken stream (413 if it ran past the bound first)
        elif any(rule in json.loads(answer)["error"] for rule in STRICTER):
            assert status == 400  # RFC 1952 checks Python's gzip module skips (see reference_decode)
        else:  # decodable and small enough: refused only for its nesting
            deepest, open_string = naive_depth(plain)
            assert status == 400 and json.loads(answer)["error"].startswith("request body nests JSON deeper")
            assert deepest > LIMITS.max_json_depth or open_string, (deepest, open_string)

    return decode


def cases(compress: Callable[[bytes], bytes], seed: int) -> list[bytes]:
    """Half compressed mutations of the documents (varied content), half mutations of the compressed
    documents (broken streams, wrong checks, trailing bytes, extra members)."""
    n = case_count()
    seeds = [compress(d) for d in DOCS] + [compress(DOCS[0]) + compress(b"[" * 20)]
    return [compress(c) for c in mutations(DOCS + list(INTERESTING[:3]), n // 2, seed)] + \
        mutations(seeds, n - n // 2, seed + 1)


def test_fuzz_gzip_json_bodies() -> None:
    failures = fuzz(check("gzip"), cases(lambda b: gzip.compress(b, mtime=0), SEED), allowed=())
    assert not failures, describe(failures)


def test_fuzz_deflate_json_bodies() -> None:
    failures = fuzz(check("deflate"), cases(zlib.compress, SEED + 2), allowed=())
    assert not failures, describe(failures)


def test_references_agree_on_the_seeds() -> None:
    """The harness itself: unmutated seeds pass or are refused exactly as the references say."""
    for doc in DOCS:
        status, received, _ = asyncio.run(through_door(gzip.compress(doc), "gzip"))
        deep = naive_depth(doc)[0] > LIMITS.max_json_depth
        assert (status, received) == ((400, None) if deep else (200, doc))
