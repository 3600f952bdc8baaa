"""Content-Encoding of HTTP request bodies, decoded within bounds on the output and on the work.

The HTTP limits (infersight.http.limits) scan a JSON body's nesting before any parser sees it; a
gzip'd body would hide its brackets from that scan, so the limits decode it first, here. A
decompression bomb (a few KB that inflate to gigabytes) stops at the bound: zlib is asked for at
most `limit + 1` bytes, so no more than that is ever allocated, whatever the ratio.

    gzip, x-gzip   RFC 1952 members (several concatenated members are read as one body, as
                   Python's gzip.decompress and most servers read them; none is an empty body);
                   stricter than Python's gzip module: a header CRC (FHCRC) is checked and
                   reserved header flags are refused, as RFC 1952 asks
    deflate        RFC 1950 zlib stream (what HTTP calls deflate)
    identity / ""  the body as it came
Anything else, or several codings stacked ("gzip, br"), is refused: we cannot look inside it.

The work is bounded too (InflateBounds), because the output bound alone does not bound it: a body
of 400,000 empty gzip members inflates to nothing and cost a fresh decompressor and a copy of the
rest of the body per member (quadratic: 60 s for 8 MiB). Members are counted and capped, input is
fed to zlib in slices (a member's leftover is at most one slice, never the rest of the body), the
inflation ratio is capped past a floor (Apache's mod_deflate caps it at 200 by default), and a
deadline ends whatever is left. Each is a 413: more than the server is willing to process.
"""
from __future__ import annotations

import re
import time
import zlib
from dataclasses import dataclass

#: Content-Encoding values that decode_body reads (lower case).
SUPPORTED = ("gzip", "x-gzip", "deflate")
_SLICE = 16 << 10  # input fed to zlib per call: a member's leftover copy is at most this
_NOT_ZERO = re.compile(rb"[^\0]")  # the end of zero padding between gzip members (C speed, no copy)


@dataclass(frozen=True)
class InflateBounds:
    """The work one encoded body may cost. max_members: gzip members (a streaming compressor writes
    one per flush; bgzip one per 64 KiB, 128 for an 8 MiB body); max_ratio: decoded bytes per encoded
    byte, checked once the decoded size passes ratio_floor_bytes (JSON rarely passes 20; mod_deflate's
    default cap is 200); max_seconds: a deadline over the whole decode."""

    max_members: int = 1024
    max_ratio: int = 200
    ratio_floor_bytes: int = 64 << 10
    max_seconds: float = 2.0

    def __post_init__(self) -> None:
        for name in ("max_members", "max_ratio", "ratio_floor_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds}")


DEFAULT_BOUNDS = InflateBounds()


class EncodingRefused(ValueError):
    """A body that cannot be decoded within the bounds: status 413 (it inflates past the limit, or
    costs more work than the bounds allow), 415 (a coding we do not read) or 400 (not valid for its
    coding); reason names it for the counters."""

    def __init__(self, status: int, message: str, reason: str) -> None:  # noqa: D107
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def is_identity(encoding: str) -> bool:
    """Whether a Content-Encoding header value leaves the body as it is."""
    return encoding.strip().lower() in ("", "identity")


def decode_body(body: bytes, encoding: str, limit: int, bounds: InflateBounds = DEFAULT_BOUNDS) -> bytes:
    """`body` decoded as its Content-Encoding says, never more than `limit` bytes and never more work
    than `bounds` allow (EncodingRefused)."""
    coding = encoding.strip().lower()
    if coding in ("", "identity"):
        return body
    if coding not in SUPPORTED:
        raise EncodingRefused(415, f"content-encoding {encoding.strip()[:40]!r} is not supported "
                              f"(use {', '.join(SUPPORTED)} or none)", "unsupported_encoding")
    gzip = coding != "deflate"
    if gzip and not body:
        return b""  # no member at all: an empty body (as Python's gzip.decompress reads it)
    return _Inflate(body, coding, limit, bounds).run()


class _Inflate:
    """One body's decode: members in turn, each fed to its own decompressor a slice at a time."""

    def __init__(self, body: bytes, coding: str, limit: int, bounds: InflateBounds) -> None:
        self.view, self.coding, self.limit, self.bounds = memoryview(body), coding, limit, bounds
        self.gzip = coding != "deflate"
        self.out = bytearray()
        self.deadline = time.monotonic() + bounds.max_seconds

    def run(self) -> bytes:
        pos, end, members = 0, len(self.view), 0
        while True:
            members += 1
            if members > self.bounds.max_members:
                self._too_costly(f"has more than {self.bounds.max_members} gzip members")
            pos = self._member(pos)
            if self.gzip:  # zero bytes may pad between and after members (as Python's gzip module reads them)
                found = _NOT_ZERO.search(self.view, pos)
                pos = found.start() if found else end
            if pos == end:
                return bytes(self.out)
            if not self.gzip:
                raise EncodingRefused(400, f"request body is not valid {self.coding}: data after the stream",
                                      "invalid_encoding")

    def _member(self, pos: int) -> int:
        """Inflate the member (or deflate stream) starting at `pos`; where the next one starts."""
        inflater = zlib.decompressobj(wbits=31 if self.gzip else 15)
        while not inflater.eof:
            if pos >= len(self.view):  # input ran out before the stream's end
                raise EncodingRefused(400, f"request body is not valid {self.coding}: truncated", "invalid_encoding")
            piece = self.view[pos:pos + _SLICE]
            pos += len(piece)
            try:
                self.out += inflater.decompress(piece, self.limit + 1 - len(self.out))  # never more than the bound
            except zlib.error as exc:
                raise EncodingRefused(400, f"request body is not valid {self.coding}: {exc}",
                                      "invalid_encoding") from None
            if len(self.out) > self.limit or inflater.unconsumed_tail:  # a tail: output was capped at the bound
                raise EncodingRefused(413, f"request body inflates beyond {self.limit} bytes", "body_too_large")
            if len(self.out) > self.bounds.ratio_floor_bytes and len(self.out) > self.bounds.max_ratio * pos:
                self._too_costly(f"inflates more than {self.bounds.max_ratio} times its encoded size")
            if time.monotonic() > self.deadline:
                self._too_costly(f"takes more than {self.bounds.max_seconds:g} s to decode")
        return pos - len(inflater.unused_data)  # the leftover is within the last slice

    def _too_costly(self, what: str) -> None:
        raise EncodingRefused(413, f"request body {what}", "body_too_large")
