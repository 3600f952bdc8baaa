"""Session fixtures: the tiny checkpoints of hf_tiny_checkpoints, built once in a temporary directory."""
from __future__ import annotations

from pathlib import Path

import pytest

from hf_tiny_checkpoints import ARCHES, build_checkpoint


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """arch -> a model directory (config.json, model.safetensors, tokenizer.json, ...)."""
    root = tmp_path_factory.mktemp("hf_checkpoints")
    return {arch: build_checkpoint(root / arch, arch, seed=i) for i, arch in enumerate(ARCHES)}


@pytest.fixture(scope="session")
def sharded_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Mixtral checkpoint again, in shards of at most 100 kB (model.safetensors.index.json)."""
    return build_checkpoint(tmp_path_factory.mktemp("hf_sharded") / "mixtral", "mixtral", seed=4,
                            max_shard_size="100KB")
