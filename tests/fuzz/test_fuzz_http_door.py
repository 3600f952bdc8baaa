"""Fuzzing the HTTP door's encoded-body path (http_limits.LimitedApp + http_inflate): gzip'd and deflated
JSON bodies, mutated before and after compression, through the real ASGI middleware in-process.

Each case either reaches the app or is answered with a JSON error of status 400, 413 or 415, never
another exception, hang or allocation storm. Checked against references that are not the code under
test: Python's gzip.decompress / zlib.decompress for what the body decodes to (the app must get
exactly that, and only when it fits the bound), and a naive character-by-character bracket count
for the nesting (nothing deeper than the limit reaches the app).

A second, structure-aware set builds bodies at the work bounds (http_inflate.InflateBounds, tightened
here so small bodies reach them): gzip bodies of 0 to 60 members (the cap is 16), empty, small or
inflating 20 to 400 times, zero-padded, some cut short, corrupted or followed by junk; deflate streams
that inflate past the ratio, followed by padding or a second stream. A body is refused 413 exactly
when a naive member count (one zlib decompressor per member, as RFC 1952 defines them) or its ratio
says so, and is otherwise held to the rules above.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import random
import zlib
from typing import Any, Callable

from fuzzkit import INTERESTING, case_count, describe, fuzz, mutations
from infersight.http.inflate import InflateBounds
from infersight.http.limits import HttpLimits, LimitedApp

SEED = 4242
LIMITS = HttpLimits(max_body_bytes=4096, max_json_depth=8)
#: Work bounds small bodies reach (the defaults start at 1,024 members and a 64 KiB ratio floor).
TIGHT = HttpLimits(max_body_bytes=4096, max_json_depth=8,
                   inflate=InflateBounds(max_members=16, max_ratio=20, ratio_floor_bytes=512))
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


def reference_members(body: bytes, encoding: str) -> tuple[int, int, bool]:
    """How a decodable body's members read, one zlib decompressor each (as RFC 1952 defines them; a
    deflate body is one stream): (members read, the bytes they decode to, whether a member follows
    that zlib refuses where Python's gzip module is laxer, see STRICTER)."""
    if encoding == "deflate":
        return 1, len(zlib.decompress(body)), False
    count, decoded, rest = 0, 0, body
    while rest:
        inflater = zlib.decompressobj(wbits=31)
        try:
            decoded += len(inflater.decompress(rest))
        except zlib.error:
            return count, decoded, True
        count += 1
        rest = inflater.unused_data.lstrip(b"\0")
    return count, decoded, False


async def through_door(body: bytes, encoding: str, limits: HttpLimits = LIMITS) -> tuple[int, bytes | None, bytes]:
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

    await LimitedApp(app, limits)(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, got.get("body"), b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def check(encoding: str, limits: HttpLimits = LIMITS) -> Callable[[bytes], None]:
    bounds = limits.inflate

    def decode(body: bytes) -> None:
        status, received, answer = asyncio.run(through_door(body, encoding, limits))
        try:
            plain: bytes | None = reference_decode(body, encoding)
        except ReferenceError_:
            plain = None
        # Too costly: over the member cap (counting a member zlib refuses, which the door counts before
        # it reads it), or inflating past the ratio beyond its floor (the door feeds zlib 16 KiB at a
        # time; these bodies are smaller, so it has seen all of it at every check).
        # `decoded`: what the door inflates before it stops, at a member only Python's gzip module reads.
        costly, decoded = False, 0
        if plain is not None:
            members, decoded, refused = reference_members(body, encoding)
            costly = members + refused > bounds.max_members or (
                decoded > bounds.ratio_floor_bytes and decoded > bounds.max_ratio * len(body))
        if received is not None:  # accepted: exactly the reference's bytes, within every bound
            assert status == 200 and plain is not None and received == plain, (status, len(received))
            assert len(received) <= limits.max_body_bytes and naive_depth(received)[0] <= limits.max_json_depth
            assert not costly
            return
        assert status in (400, 413, 415), status
        assert set(json.loads(answer)) == {"error"}
        if len(body) > limits.max_body_bytes or decoded > limits.max_body_bytes:
            assert status == 413, status
        elif costly:
            assert status == 413 and ("gzip members" in answer.decode() or "times its encoded size" in answer.decode())
        elif plain is None:
            assert status in (400, 413), status  # broken stream (413 if it ran past the bound first)
        elif any(rule in json.loads(answer)["error"] for rule in STRICTER):
            assert status == 400  # RFC 1952 checks Python's gzip module skips (see reference_decode)
        else:  # decodable and small enough: refused only for its nesting
            deepest, open_string = naive_depth(plain)
            assert status == 400 and json.loads(answer)["error"].startswith("request body nests JSON deeper")
            assert deepest > limits.max_json_depth or open_string, (deepest, open_string)

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


_CONTENTS = (lambda r: b"", lambda r: b"[%d]" % r.randrange(1000), lambda r: b"[" * r.randrange(1, 12),
             lambda r: b" " * r.choice((100, 511, 512, 513, 2000, 4000, 50_000)))


def member_case(rng: random.Random) -> bytes:
    """A gzip body at the work bounds: members of every kind, padding, and sometimes damage at the end."""
    parts = []
    for _ in range(rng.choice((0, 1, 2, 15, 16, 17, 40, rng.randrange(60)))):
        member = gzip.compress(rng.choice(_CONTENTS)(rng), mtime=0, compresslevel=rng.choice((1, 6, 9)))
        parts.append(member + b"\0" * rng.choice((0, 0, 1, 7)))
    body = bytearray(b"".join(parts))
    damage = rng.randrange(6)
    if damage == 0 and body:
        del body[-rng.randrange(1, min(len(body), 12) + 1):]  # cut short
    elif damage == 1 and body:
        body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)  # one bit flipped
    elif damage == 2:
        body += rng.choice((b"junk", b"\x1f\x8b", b"\x1f\x8b\x08\x00"))  # trailing bytes, a member begun
    return bytes(body)


def deflate_case(rng: random.Random) -> bytes:
    body = zlib.compress(rng.choice(_CONTENTS)(rng), rng.choice((1, 6, 9)))
    extra = rng.randrange(4)
    if extra == 0:
        body += b"\0" * rng.randrange(1, 8)  # padding: gzip's allowance, not deflate's
    elif extra == 1:
        body += zlib.compress(b"[1]")  # a second stream
    return body


def test_fuzz_gzip_bodies_at_the_work_bounds() -> None:
    rng = random.Random(SEED + 4)
    failures = fuzz(check("gzip", TIGHT), [member_case(rng) for _ in range(case_count())], allowed=())
    assert not failures, describe(failures)


def test_fuzz_deflate_bodies_at_the_work_bounds() -> None:
    rng = random.Random(SEED + 5)
    failures = fuzz(check("deflate", TIGHT), [deflate_case(rng) for _ in range(case_count())], allowed=())
    assert not failures, describe(failures)


def test_references_agree_on_the_seeds() -> None:
    """The harness itself: unmutated seeds pass or are refused exactly as the references say."""
    for doc in DOCS:
        status, received, _ = asyncio.run(through_door(gzip.compress(doc), "gzip"))
        deep = naive_depth(doc)[0] > LIMITS.max_json_depth
        assert (status, received) == ((400, None) if deep else (200, doc))
