"""Shared printing for commands: key: value lines for people, then one JSON object for programs."""
from __future__ import annotations

import json


def print_result(result: dict[str, object], json_only: bool) -> int:
    if not json_only:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    print(json.dumps(result))
    return 0
