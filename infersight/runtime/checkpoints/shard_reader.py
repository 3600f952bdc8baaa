"""The safetensors files of a model directory, single or sharded (model.safetensors.index.json),
read one tensor at a time: headers (names, shapes) first without reading data, then each tensor
through a memory map, so the weights are never held twice."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from infersight.runtime.checkpoints.model_dir import read_json
from infersight.runtime.errors import WeightsError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class ShardReader:
    """shapes() -> {name: shape} over every shard; tensors() yields (name, tensor) one by one."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.files = self._files()

    def _files(self) -> list[Path]:
        if (self.directory / INDEX_FILE).is_file():
            weight_map = read_json(self.directory, INDEX_FILE).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise WeightsError(f"{self.directory / INDEX_FILE} has no weight_map")
            files = [self.directory / f for f in sorted(set(weight_map.values()))]
        elif (self.directory / SINGLE_FILE).is_file():
            files = [self.directory / SINGLE_FILE]
        else:
            raise WeightsError(f"{self.directory}: no {SINGLE_FILE} nor {INDEX_FILE}")
        for f in files:
            if not f.is_file():
                raise WeightsError(f"{f} (named in {INDEX_FILE}) not found")
        return files

    def _open(self, path: Path):  # noqa: ANN202 -- safetensors' handle type is not exported
        from safetensors import SafetensorError, safe_open

        try:
            return safe_open(str(path), framework="pt")
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise WeightsError(f"cannot read {path} as safetensors: {exc}") from None

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape, from the file headers only."""
        out: dict[str, tuple[int, ...]] = {}
        for path in self.files:
            with self._open(path) as f:
                for name in f.keys():
                    if name in out:
                        raise WeightsError(f"{self.directory}: tensor {name} is in two shards")
                    out[name] = tuple(f.get_slice(name).get_shape())
        return out

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for path in self.files:
            with self._open(path) as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
