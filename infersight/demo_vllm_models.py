"""The trained models the vLLM demo serves: the reference demo's target and draft (tiny-moe, tiny-draft),
exported as Hugging Face directories (tiny-moe as Mixtral, tiny-draft as Llama, the byte tokenizer as
tokenizer.json) into a cache folder, so that vLLM runs the same weights and the same tokens as our engine.

Each export lands in ``<cache>/<name>-<sha256 of its files, 12 hex>``: a changed weight, config or
tokenizer gets a new folder, an unchanged one reuses the old (vLLM's compile cache is keyed by the
path). Exporting costs about a second each; it is written to a temporary folder first and renamed,
so two demos starting at once never read half a checkpoint.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import infersight

#: The trained weights the package ships (infersight/models/<name>.safetensors, the engine's names).
SHIPPED_MODELS_DIR = Path(infersight.__file__).resolve().parent / "models"
EXPORTED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                  "tokenizer_config.json")


class TrainedWeightsMissing(RuntimeError):
    """The package holds no trained weights for a model the demo serves."""


@dataclass(frozen=True)
class TrainedExports:
    """Hugging Face directories of the demo's target model and its draft."""

    model: Path
    draft: Path


def default_cache() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "infersight" / "hf-export"


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for name in EXPORTED_FILES:
        h.update(name.encode() + b"\0")
        with open(folder / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:12]


def export_trained(name: str, cache: Path) -> Path:
    """`name`'s shipped trained weights as a Hugging Face directory under `cache`; returns it."""
    from infersight.runtime.checkpoints.export import export_hf

    weights = SHIPPED_MODELS_DIR / f"{name}.safetensors"
    # Named explicitly: the engine's fallback for a model without weights is random init, which
    # would make vLLM's text gibberish and its acceptance rate meaningless without a word.
    if not weights.is_file():
        raise TrainedWeightsMissing(f"no trained weights for {name} at {weights}")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
    try:
        export_hf(name, tmp, weights=weights)
        final = cache / f"{name}-{_digest(tmp)}"
        if final.is_dir():
            return final
        try:
            tmp.rename(final)
        except OSError:  # another process renamed the same export in first
            if not final.is_dir():
                raise
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_demo_models(model: str, draft: str, cache: Path | None = None) -> TrainedExports:
    """The demo's target and draft, exported (or found) under `cache` (default: default_cache())."""
    cache = cache or default_cache()
    return TrainedExports(model=export_trained(model, cache), draft=export_trained(draft, cache))
