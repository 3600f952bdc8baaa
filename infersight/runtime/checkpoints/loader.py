"""Load a Hugging Face model directory's weights into the engine's model, one tensor at a time.

Every name and shape is checked against the config from the shard headers before any tensor is
read, so a missing tensor, an unexpected one or a shape mismatch is one error naming the tensor,
raised before the engine serves anything. Then each tensor is read from its memory-mapped shard,
copied (and cast) into its rows of the parameter, and dropped: the weights are never held twice.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from infersight.runtime.checkpoints.architectures import architecture_of
from infersight.runtime.checkpoints.model_dir import read_json
from infersight.runtime.checkpoints.shard_reader import ShardReader
from infersight.runtime.checkpoints.tensor_names import IGNORED_SUFFIXES, TensorTarget, checkpoint_tensors
from infersight.runtime.errors import WeightsError
from infersight.runtime.model.model_config import ModelConfig


def _skipped(name: str, cfg: ModelConfig) -> bool:
    return name.endswith(IGNORED_SUFFIXES) or (cfg.tie_word_embeddings and name == "lm_head.weight")


def check_tensors(directory: Path, cfg: ModelConfig, expected: dict[str, TensorTarget],
                  shapes: dict[str, tuple[int, ...]]) -> None:
    """Names and shapes of the checkpoint against the config; raises WeightsError on the first
    missing, unexpected or misshapen tensor (in name order, so the error is reproducible)."""
    for name in sorted(expected):
        if name not in shapes:
            raise WeightsError(f"{directory}: tensor {name} is missing from the checkpoint")
        if shapes[name] != expected[name].shape:
            raise WeightsError(f"{directory}: tensor {name} has shape {list(shapes[name])}, "
                               f"the config ({cfg.name}) implies {list(expected[name].shape)}")
    for name in sorted(shapes):
        if name not in expected and not _skipped(name, cfg):
            raise WeightsError(f"{directory}: tensor {name} is not part of this architecture")


def load_checkpoint(model: nn.Module, cfg: ModelConfig) -> None:
    """Fill every parameter of `model` (built from cfg) from cfg.checkpoint."""
    directory = Path(cfg.checkpoint)
    _, arch = architecture_of(read_json(directory, "config.json"), str(directory / "config.json"))
    expected = checkpoint_tensors(cfg, arch.moe)
    reader = ShardReader(directory)
    check_tensors(directory, cfg, expected, reader.shapes())
    params = dict(model.named_parameters())
    wanted = {t.param for t in expected.values()}
    if wanted != set(params):  # the model and the name map disagree: a bug here, not in the checkpoint
        raise WeightsError(f"{cfg.name}: the tensor map does not cover the model's parameters "
                           f"{sorted(set(params) ^ wanted)[:5]}")
    with torch.no_grad():
        for name, tensor in reader.tensors():
            target = expected.get(name)
            if target is None:
                continue
            param = params[target.param]
            param[target.start:target.start + tensor.shape[0]].copy_(tensor)  # copy_ casts and moves
