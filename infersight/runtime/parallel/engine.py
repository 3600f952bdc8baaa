"""The engine of one expert-parallel rank: the single-process Engine with its MoE layers sharded.

Every rank runs this same loop on the same requests: scheduling, sampling and the dense parts are
replicated and deterministic (seeded per request), so the ranks stay in lockstep and call the
layers' collectives in the same order. Only the routed experts are split between ranks.

Each rank builds the full model first (the same seeded init or weights file as the
single-process engine, hence the same weights), then drops the experts it does not host: peak
memory is one full model per rank while it starts.
"""
from __future__ import annotations

import gc
from typing import Mapping

import torch

from infersight.runtime.config import EngineConfig
from infersight.runtime.engine import Engine
from infersight.runtime.model import Transformer
from infersight.runtime.moe import MoEFFN
from infersight.runtime.observer import EngineObserver
from infersight.runtime.parallel.group import EPGroup
from infersight.runtime.parallel.moe import ExpertParallelMoE
from infersight.runtime.parallel.placement import LayerPlacement
from infersight.runtime.parallel.stats import EPLayerStats, EPStatsCollector
from infersight.runtime.ranges import RangeMarker
from infersight.runtime.stats import StepStats


def shard_experts(model: Transformer, group: EPGroup, stats: EPStatsCollector, ranges: RangeMarker,
                  placements: Mapping[int, LayerPlacement] | None = None) -> list[ExpertParallelMoE]:
    """Replace every MoE layer's FFN by its expert-parallel version, in place. placements: per layer
    index; a layer without one gets the contiguous home placement. Returns the new layers."""
    placements = placements or {}
    out = []
    for i, layer in enumerate(model.layers):
        if not isinstance(layer.ffn, MoEFFN) or isinstance(layer.ffn, ExpertParallelMoE):
            continue
        placement = placements.get(i) or LayerPlacement.contiguous(layer.ffn.n_experts, group.world)
        layer.ffn = ExpertParallelMoE(layer.ffn, i, group, placement, stats, ranges)
        out.append(layer.ffn)
    return out


class ExpertParallelEngine(Engine):
    """Engine whose target model's MoE layers run expert-parallel over `group`.

    After each step the layers' stats go to the observer's on_ep_stats (ProbeObserver writes them
    as EP_STATS records) and stay readable as `last_ep_stats`. A speculative draft model, if any,
    stays replicated."""

    def __init__(self, config: EngineConfig, group: EPGroup, observer: EngineObserver | None = None,
                 placements: Mapping[int, LayerPlacement] | None = None) -> None:
        if not config.model_config.is_moe:
            raise ValueError(f"model {config.model_config.name!r} has no experts to shard")
        super().__init__(config, observer)
        self.group = group
        self.ep_stats = EPStatsCollector(group.rank, group.world, config.device)
        self.ep_layers = shard_experts(self.target.model, group, self.ep_stats, self.ranges, placements)
        self.last_ep_stats: list[EPLayerStats] = []
        gc.collect()  # the dropped experts' parameters
        if config.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def step(self) -> StepStats:
        stats = super().step()
        self.last_ep_stats = self.ep_stats.flush(stats.step_id, self.observer)
        return stats
