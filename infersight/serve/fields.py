"""Typed readers for the fields of a request body. Each names its field in the 400 it raises, so a
client learns which value to fix; none lets a value through that a later stage (the sampler, the
probe records, the response encoder) could not take: strings must encode as UTF-8, numbers be
finite, integers be integers (5.0 counts, as in vLLM's pydantic models; 5.5 and true do not)."""
from __future__ import annotations

import json
import math
from typing import Any, Mapping

from infersight.serve.api_error import APIError

_KINDS: dict[str, type] = {"string": str, "boolean": bool, "object": dict, "array": list}


def check(cond: bool, param: str, message: str) -> None:
    if not cond:
        raise APIError(400, message, param=param)


def show(value: Any) -> str:
    """A value for an error message: JSON, ASCII-only (a lone surrogate becomes \\ud800), short."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _an(kind: str) -> str:
    return f"a{'n' if kind[0] in 'aeiou' else ''} {kind}"


def utf8(value: str, param: str) -> str:
    """value, if it encodes as UTF-8 (JSON's \\ud800 escapes decode to lone surrogates, which do not)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(400, f"{param} is not valid Unicode text: a lone surrogate at character {exc.start}",
                       param=param) from None
    return value


def optional(body: Mapping[str, Any], key: str, kind: str, default: Any) -> Any:
    """body[key] if present and not null, of JSON type `kind` (string, boolean, object, array)."""
    value = body.get(key)
    if value is None:
        return default
    check(isinstance(value, _KINDS[kind]), key, f"{key} must be {_an(kind)}, got {show(value)}")
    return utf8(value, key) if kind == "string" else value


def number(body: Mapping[str, Any], key: str, default: float | None) -> float | None:
    """A JSON number (range and finiteness are the caller's: the messages name the range)."""
    value = body.get(key)
    if value is None:
        return default
    check(isinstance(value, (int, float)) and not isinstance(value, bool), key,
          f"{key} must be a number, got {show(value)}")
    try:
        return float(value)
    except OverflowError:  # an integer of hundreds of digits
        return math.inf if value > 0 else -math.inf


def integer(body: Mapping[str, Any], key: str, default: int | None) -> int | None:
    """A JSON integer, or a float with no fractional part (1e30 is the integer 10**30)."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    check(isinstance(value, int) and not isinstance(value, bool), key, f"{key} must be an integer, got {show(value)}")
    return value


def in_range(body: Mapping[str, Any], key: str, low: float, high: float, neutral: float) -> None:
    """A numeric knob the engine does not have: any value in [low, high] is valid (vLLM's range),
    but only `neutral` (the knob off) can be honoured."""
    value = number(body, key, None)
    if value is None:
        return
    check(math.isfinite(value), key, f"{key} must be a finite number, got {value}.")
    check(low <= value <= high, key, f"{key} must be in [{low:g}, {high:g}], got {value}.")  # vLLM's wording
    check(value == neutral, key, f"{key} is not supported by this server (only {neutral:g})")


def strings(body: Mapping[str, Any], key: str) -> list[str]:
    """A string or a list of strings (as `stop`), each non-empty UTF-8 text."""
    value = body.get(key)
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    check(isinstance(items, list) and all(isinstance(s, str) for s in items), key,
          f"{key} must be a string or a list of strings, got {show(value)}")
    for i, s in enumerate(items):
        utf8(s, f"{key}[{i}]" if isinstance(value, list) else key)
        check(bool(s), key, f"{key} cannot contain an empty string.")
    return items
