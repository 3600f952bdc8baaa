"""argparse types for numeric flags with their range checked at parse time.

`--batch 99999999999` used to reach the roofline and allocate for it; a flag that is out of range,
not finite or not a number is now argparse's one-line usage error (exit 2) naming the flag and the
range, before any work starts.
"""
from __future__ import annotations

import argparse
import math
from typing import Callable


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse `type` accepting integers in [low, high] (plain decimal digits only)."""
    def parse(text: str) -> int:
        s = text.strip()
        digits = s[1:] if s[:1] in "+-" else s
        if not digits.isdigit() or len(digits) > 20:  # no "1e9", no 4,300-digit conversions
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high}, got {text[:40]!r}")
        value = int(s)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: expected {low} to {high}")
        return value
    parse.__name__ = "integer"  # argparse names the type in its message
    return parse


def bounded_float(low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
    """An argparse `type` accepting finite floats in [low, high] ((low, high] with low_open)."""
    def parse(text: str) -> float:
        try:
            value = float(text[:64])
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
        below = value <= low if low_open else value < low
        if not math.isfinite(value) or below or value > high:
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"{text[:40]} is out of range: expected {bracket}{low:g}, {high:g}]")
        return value
    parse.__name__ = "number"
    return parse
