"""One expert-parallel rank's model, built with only the experts its placement gives it.

    declare on meta   Transformer(cfg): every parameter a shape, no memory
    shard             each MoEFFN -> ExpertParallelMoE keeping placement.slots[rank] (still meta)
    materialise       to_empty(device): only what the rank kept is allocated
    fill              weights file: only the kept tensors are read (safetensors, lazily)
                      random: init_named_random over the *full* model's names (see below)

The other ranks' experts are never allocated or loaded here. Random init must give the weights
the single-process model gets: weights.init_random draws every parameter from one generator in
name order, so a parameter this rank does not keep still advances that generator, drawn into a
transient buffer of that one tensor's size; the kept parameters then get the same numbers as in
the full model, and the ranks generate the single-process engine's tokens.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

from infersight.runtime.config import EngineConfig
from infersight.runtime.errors import WeightsError
from infersight.runtime.model.transformer import Transformer
from infersight.runtime.model.moe import MoEFFN
from infersight.runtime.parallel.group import EPGroup
from infersight.runtime.parallel.moe import ExpertParallelMoE
from infersight.runtime.parallel.placement import LayerPlacement
from infersight.runtime.parallel.stats import EPStatsCollector
from infersight.runtime.ranges import RangeMarker
from infersight.runtime.model.weights import init_named_random, shipped_weights


def layer_placements(model: Transformer, world: int,
                     placements: Mapping[int, LayerPlacement] | None = None) -> dict[int, LayerPlacement]:
    """The placement of every MoE layer: placements[i] when given, else the contiguous home one."""
    placements = placements or {}
    return {i: placements.get(i) or LayerPlacement.contiguous(layer.ffn.n_experts, world)
            for i, layer in enumerate(model.layers) if isinstance(layer.ffn, MoEFFN)}


def shard_experts(model: Transformer, group: EPGroup, stats: EPStatsCollector, ranges: RangeMarker,
                  placements: Mapping[int, LayerPlacement] | None = None,
                  device: torch.device | str | None = None) -> list[ExpertParallelMoE]:
    """Replace every MoE layer's FFN by its expert-parallel version, in place; the experts this rank
    does not host leave the model. placements: per layer index; a layer without one gets the
    contiguous home placement. device: of the routing tables (needed while the model is on meta).
    Returns the new layers."""
    out = []
    for i, placement in layer_placements(model, group.world, placements).items():
        layer = model.layers[i]
        if isinstance(layer.ffn, ExpertParallelMoE):
            continue
        layer.ffn = ExpertParallelMoE(layer.ffn, i, group, placement, stats, ranges, device)
        out.append(layer.ffn)
    return out


def build_local_model(config: EngineConfig, group: EPGroup, stats: EPStatsCollector, ranges: RangeMarker,
                      placements: Mapping[int, LayerPlacement] | None = None, *, attention_backend: str = "flash",
                      decode_attention: str = "torch") -> Transformer:
    """This rank's model in eval mode on config.device: dense parts, router and shared expert whole,
    routed experts only those of placements (per layer; default contiguous) on group.rank."""
    cfg = config.model_config
    with torch.device("meta"):
        model = Transformer(cfg, attention_backend, ranges, decode_attention).to(config.torch_dtype)
    # The full model's names, each with the module that owns it (expert modules survive sharding
    # unchanged inside ExpertParallelMoE.local_experts; the others' leave the model).
    owners = {name: (model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2])
              for name, _ in model.named_parameters()}
    meta = dict(model.named_parameters())
    shard_experts(model, group, stats, ranges, placements, device=config.device)
    model = model.to_empty(device=config.device)
    model.rope.reset_tables()
    kept = {id(m) for m in model.modules()}
    params = {name: getattr(module, leaf) if id(module) in kept else meta[name]
              for name, (module, leaf) in owners.items()}
    path = config.weights if config.weights is not None else shipped_weights(cfg.name)
    if path is not None:
        load_named_safetensors(params, path, cfg.name)
    else:
        init_named_random(params, cfg.n_layers, config.seed, config.device)
    return model.eval()


def load_named_safetensors(params: Mapping[str, torch.Tensor], path: str | Path, model_name: str) -> None:
    """Fill the non-meta tensors of params (full-model names) from a safetensors file, reading only
    those; the file must hold exactly the full model's names and shapes (meta tensors included)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights file not found: {path}")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            names = set(f.keys())
            missing, extra = sorted(set(params) - names), sorted(names - set(params))
            if missing or extra:
                raise WeightsError(f"{path} does not match model {model_name!r}: missing {missing[:5]}, "
                                   f"unexpected {extra[:5]}")
            with torch.no_grad():
                for name, param in params.items():
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != tuple(param.shape):
                        raise WeightsError(f"{path}: {name} has shape {shape}, model {model_name!r} expects "
                                           f"{tuple(param.shape)}")
                    if not param.is_meta:
                        param.copy_(f.get_tensor(name).to(param.dtype))
    except WeightsError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise WeightsError(f"cannot read {path} as safetensors: {exc}") from None
