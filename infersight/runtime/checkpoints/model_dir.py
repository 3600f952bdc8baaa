"""What makes a path a Hugging Face model directory, and reading its JSON files."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infersight.runtime.errors import WeightsError

#: Where transformers 5 saves a single chat template, beside tokenizer_config.json.
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def is_model_dir(path: str | Path) -> bool:
    """A directory holding a config.json (what transformers' from_pretrained and vLLM take)."""
    try:
        return (Path(path) / "config.json").is_file()
    except (OSError, ValueError):  # a name too long or with a NUL is no directory
        return False


def read_json(directory: str | Path, name: str, required: bool = True) -> dict[str, Any]:
    """The JSON object in directory/name; {} when it is absent and not required."""
    path = Path(directory) / name
    if not path.is_file():
        if required:
            raise WeightsError(f"{path} not found")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WeightsError(f"cannot read {path} as JSON: {exc}") from None
    if not isinstance(value, dict):
        raise WeightsError(f"{path} is not a JSON object")
    return value
