"""Packing one probe record so that no value can make the engine raise.

`RecordStruct.pack` first tries the plain C `struct` pack (the common case costs one call). Only
when a value does not fit its field does it coerce every value and pack again, so a bad value
costs its one field, never the record or the request:

- integer fields saturate at their range (``max_tokens = 2**40`` in a u32 field reads 4294967295,
  ``top_k = -1e30`` in an i64 reads -2**63): the reader sees "at least this", the closest truth
  the field can hold; a float is truncated toward zero first; NaN, None or any non-number is 0;
- float fields take any float (inf and NaN included); an int too large for a double is ±inf, a
  non-number NaN;
- bytes fields take str as UTF-8 with unencodable characters (lone surrogates such as
  ``"\\ud800"``) replaced by ``?``; anything else is empty.

Every coerced field is counted in ``fixes`` ("field: reason" -> records) and logged at most once
per ``log_interval_s`` per record kind: a counted change, never a silent one.
"""
from __future__ import annotations

import logging
import math
import operator
import struct
import time
from collections import Counter
from typing import Sequence

log = logging.getLogger("infersight.probes")

_INT_RANGES = {"q": (-(1 << 63), (1 << 63) - 1), "Q": (0, (1 << 64) - 1), "I": (0, (1 << 32) - 1),
               "H": (0, (1 << 16) - 1), "B": (0, (1 << 8) - 1)}
#: What a value that `struct` refuses can raise.
PACK_ERRORS = (struct.error, OverflowError, TypeError, ValueError, UnicodeError)


def _arg_codes(fields: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """(field, code) per pack argument: a repeated code such as "64I" is 64 arguments."""
    out = []
    for name, code in fields:
        if code.endswith("s"):
            out.append((name, code))
            continue
        count = int(code[:-1]) if len(code) > 1 else 1
        out.extend([(name, code[-1])] * count)
    return out


def _coerce_int(value: object, lo: int, hi: int) -> tuple[int, str]:
    """(the value the field can hold, why it changed or "")."""
    try:
        number = operator.index(value)  # int, bool, numpy integers
    except TypeError:
        if not isinstance(value, float):
            try:
                value = float(value)  # type: ignore[arg-type]  # numpy floats, Decimal, ...
            except (TypeError, ValueError, OverflowError):
                return 0, "not a number"
        if math.isnan(value):
            return 0, "not a number"
        if math.isinf(value):
            return (hi if value > 0 else lo), "clamped"
        number = math.trunc(value)
        if lo <= number <= hi:
            return number, "truncated"
    if number < lo:
        return lo, "clamped"
    if number > hi:
        return hi, "clamped"
    return number, ""


def _coerce_float(value: object) -> tuple[float, str]:
    try:
        return float(value), ""  # type: ignore[arg-type]
    except OverflowError:
        return (math.inf if value > 0 else -math.inf), "clamped"  # type: ignore[operator]
    except (TypeError, ValueError):
        return math.nan, "not a number"


def _coerce_bytes(value: object) -> tuple[bytes, str]:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), ""
    if isinstance(value, str):
        try:
            return value.encode("utf-8"), ""
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace"), "unencodable"
    return b"", "not bytes"


class RecordStruct:
    """The packed little-endian layout of one record kind; ``pack`` never raises for a value.

    ``fast_pack`` is the bare C pack (raises ``PACK_ERRORS``): a hot path may call it inside
    ``try`` and fall back to ``pack``, which costs nothing until a value is bad.
    """

    def __init__(self, name: str, fields: Sequence[tuple[str, str]], log_interval_s: float = 60.0) -> None:
        self.name = name
        self._struct = struct.Struct("<" + "".join(code for _, code in fields))
        self.size = self._struct.size
        self.format = self._struct.format
        self.fast_pack = self._struct.pack
        self.unpack = self._struct.unpack
        self._args = _arg_codes(fields)
        self.fixes: Counter[str] = Counter()
        self._log_interval_s = log_interval_s
        self._next_log = 0.0

    def pack(self, *values: object) -> bytes:
        """The record's bytes; a value out of its field's range is coerced (see the module) and counted."""
        try:
            return self._struct.pack(*values)
        except PACK_ERRORS:
            return self._struct.pack(*self.coerce(values))

    def coerce(self, values: Sequence[object]) -> list[object]:
        """Values every field can hold, counting each change in ``fixes``. A wrong number of
        values is a caller bug, not bad input: it still raises (struct.error)."""
        if len(values) != len(self._args):
            raise struct.error(f"{self.name} record takes {len(self._args)} values, got {len(values)}")
        out: list[object] = []
        changed = []
        for value, (field, code) in zip(values, self._args):
            if code.endswith("s"):
                fixed, why = _coerce_bytes(value)
            elif code == "d":
                fixed, why = _coerce_float(value)
            else:
                fixed, why = _coerce_int(value, *_INT_RANGES[code])
            out.append(fixed)
            if why:
                changed.append(f"{field}: {why}")
        for key in dict.fromkeys(changed):  # an array field counts once per record
            self.fixes[key] += 1
        now = time.monotonic()
        if changed and now >= self._next_log:
            self._next_log = now + self._log_interval_s
            log.warning("probe %s record: %s (coerced and written; %d such field(s) so far, logged at most "
                        "every %.0f s)", self.name, ", ".join(dict.fromkeys(changed)), sum(self.fixes.values()),
                        self._log_interval_s)
        return out
