"""The ids that end a generation: generation_config.json's eos_token_id (an id or a list), else
config.json's, and the tokenizer's eos token, as vLLM stops on all of them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from infersight.runtime.checkpoints.model_dir import read_json


def _ids(value: Any) -> set[int]:
    if isinstance(value, bool) or value is None:
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int) and not isinstance(v, bool)}
    return set()


def eos_token_ids(directory: str | Path, tokenizer_eos: int | None) -> frozenset[int]:
    generation = read_json(directory, "generation_config.json", required=False)
    ids = _ids(generation.get("eos_token_id"))
    if not ids:
        ids = _ids(read_json(directory, "config.json").get("eos_token_id"))
    if tokenizer_eos is not None:
        ids.add(tokenizer_eos)
    return frozenset(ids)
