"""Content-Encoding of HTTP request bodies, decoded with a bound on the decoded size.

The HTTP limits (infersight.http_limits) scan a JSON body's nesting before any parser sees it; a
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
"""
from __future__ import annotations

import zlib

#: Content-Encoding values that decode_body reads (lower case).
SUPPORTED = ("gzip", "x-gzip", "deflate")


class EncodingRefused(ValueError):
    """A body that cannot be decoded within the bound: status 413 (it inflates past the limit), 415
    (a coding we do not read) or 400 (not valid for its coding); reason names it for the counters."""

    def __init__(self, status: int, message: str, reason: str) -> None:  # noqa: D107
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def is_identity(encoding: str) -> bool:
    """Whether a Content-Encoding header value leaves the body as it is."""
    return encoding.strip().lower() in ("", "identity")


def decode_body(body: bytes, encoding: str, limit: int) -> bytes:
    """`body` decoded as its Content-Encoding says, never more than `limit` bytes (EncodingRefused)."""
    coding = encoding.strip().lower()
    if coding in ("", "identity"):
        return body
    if coding not in SUPPORTED:
        raise EncodingRefused(415, f"content-encoding {encoding.strip()[:40]!r} is not supported "
                              f"(use {', '.join(SUPPORTED)} or none)", "unsupported_encoding")
    gzip = coding != "deflate"
    if gzip and not body:
        return b""  # no member at all: an empty body (as Python's gzip.decompress reads it)
    out = bytearray()
    rest = body
    while True:
        inflater = zlib.decompressobj(wbits=31 if gzip else 15)
        try:
            out += inflater.decompress(rest, limit + 1 - len(out))  # never more than the bound asks
        except zlib.error as exc:
            raise EncodingRefused(400, f"request body is not valid {coding}: {exc}", "invalid_encoding") from None
        if len(out) > limit:
            raise EncodingRefused(413, f"request body inflates beyond {limit} bytes", "body_too_large")
        if not inflater.eof:  # input ran out before the stream's end (or output was capped exactly)
            if inflater.unconsumed_tail:
                raise EncodingRefused(413, f"request body inflates beyond {limit} bytes", "body_too_large")
            raise EncodingRefused(400, f"request body is not valid {coding}: truncated", "invalid_encoding")
        rest = inflater.unused_data
        if gzip:  # zero bytes may pad between and after members (as Python's gzip module reads them)
            rest = rest.lstrip(b"\0")
        if not gzip or not rest:
            if rest:
                raise EncodingRefused(400, f"request body is not valid {coding}: data after the stream",
                                      "invalid_encoding")
            return bytes(out)
