"""A YAML writer for rule files: block mappings and sequences; each one-line string a JSON string
(which YAML reads unchanged, so no value is misread: "0.99" stays a string), each multi-line
string (PromQL, descriptions) a literal block. No YAML library is needed at run time."""
from __future__ import annotations

import json

INDENT = "  "


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return json.dumps(str(value))


def _block(text: str, depth: int) -> list[str]:
    """A literal block (`|-`: no final newline). Text a block would change (trailing spaces, a
    leading space on the first line, a final newline) is written as a JSON string instead."""
    lines = text.split("\n")
    if any(line != line.rstrip() for line in lines) or lines[0].startswith(" ") or text.endswith("\n"):
        return [json.dumps(text)]
    pad = INDENT * depth
    return ["|-"] + [pad + line if line else "" for line in lines]


def _value(value: object, depth: int) -> tuple[str, list[str]]:
    """(text after the key on its line, lines that follow)."""
    if isinstance(value, dict):
        return "", _mapping(value, depth)
    if isinstance(value, list):
        return "", _sequence(value, depth)
    if isinstance(value, str) and "\n" in value:
        head, *rest = _block(value, depth)
        return " " + head, rest
    return " " + _scalar(value), []


def _mapping(data: dict, depth: int) -> list[str]:
    pad = INDENT * depth
    out = []
    for key, value in data.items():
        if isinstance(value, (dict, list)) and not value:
            out.append(f"{pad}{key}: {'{}' if isinstance(value, dict) else '[]'}")
            continue
        head, rest = _value(value, depth + 1)
        out.append(f"{pad}{key}:{head}")
        out.extend(rest)
    return out


def _sequence(items: list, depth: int) -> list[str]:
    pad = INDENT * (depth - 1) + "- "
    out = []
    for item in items:
        if isinstance(item, dict) and item:
            lines = _mapping(item, depth)
            out.append(pad + lines[0].lstrip())
            out.extend(lines[1:])
        else:
            head, rest = _value(item, depth)
            out.append(pad + head.lstrip())
            out.extend(rest)
    return out


def dump(data: dict, header: str = "") -> str:
    """The YAML text of a mapping of strings, numbers, lists and mappings."""
    comment = [f"# {line}" if line else "#" for line in header.splitlines()]
    return "\n".join(comment + _mapping(data, 0)) + "\n"
