"""Nsight Compute value text and units -> numbers in base units.

ncu prints values with thousands separators ("1,234.5") and units with SI prefixes that differ by
page and version: the details page writes "ns", "us", "Kbyte", "Gbyte/s", "hz", "%"; the raw page
writes "nsecond", "usecond", "byte", "byte/second", "cycle/nsecond". Bytes use decimal prefixes
(Kbyte = 1000 bytes), as ncu does; "KiB"-style binary prefixes are honoured when they appear.
Base units: second, byte, hz, ratio (for "%": value / 100), and counts (cycle, inst, warp, ...)
with any prefix removed. A unit with no known conversion is kept as printed, value unchanged.
"""
from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d*)?([eE][-+]?\d+)?$")
_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
       "m": 1e-3, "u": 1e-6, "µ": 1e-6, "n": 1e-9, "p": 1e-12}
_BINARY = {"Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40}
# Spellings of each base unit (after the prefix is taken off).
_BASES = {"second": "second", "s": "second", "sec": "second", "byte": "byte", "B": "byte",
          "hz": "hz", "Hz": "hz", "cycle": "cycle", "inst": "inst", "warp": "warp", "thread": "thread",
          "block": "block", "sector": "sector", "request": "request", "wavefront": "wavefront",
          "register": "register", "SM": "SM", "cluster": "cluster", "transaction": "transaction"}
# "ms" is milliseconds, "Ms" is not a thing; prefixes that only make sense for some bases.
_SMALL_PREFIXES = {"m", "u", "µ", "n", "p"}


def parse_number(text: str) -> float | None:
    """A float from ncu's text ("1,234.5", "406240", "1.5e-05"); None for "n/a", names, ""."""
    s = text.strip()
    if not s or not _NUMBER.match(s) or not any(ch.isdigit() for ch in s):
        return None
    try:
        value = float(s.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _split_word(word: str) -> tuple[float, str] | None:
    """(multiplier, base) for one unit word such as "Kbyte", "nsecond", "Ghz", "ms"; None unknown."""
    if word in _BASES:
        return 1.0, _BASES[word]
    for prefix, mult in _BINARY.items():
        if word.startswith(prefix) and word[len(prefix):] in _BASES:
            return mult, _BASES[word[len(prefix):]]
    prefix, rest = word[:1], word[1:]
    if prefix in _SI and rest in _BASES:
        base = _BASES[rest]
        if prefix in _SMALL_PREFIXES and base not in ("second",):
            return None  # "mbyte" or "ncycle" would be a misreading, not a unit
        return _SI[prefix], base
    return None


def to_base_unit(value: float, unit: str) -> tuple[float, str]:
    """(value in base units, base unit name). "%" -> ratio; "X/Y" converts both sides."""
    u = unit.strip()
    if u == "%":
        return value / 100.0, "ratio"
    if not u:
        return value, ""
    if "/" in u:
        num, _, den = u.partition("/")
        top, bottom = _split_word(num.strip()), _split_word(den.strip())
        if top and bottom:
            return value * top[0] / bottom[0], f"{top[1]}/{bottom[1]}"
        if top and not bottom:  # e.g. "register/thread": scale the numerator only
            return value * top[0], f"{top[1]}/{den.strip()}"
        return value, u
    word = _split_word(u)
    if word is None:
        return value, u
    return value * word[0], word[1]
