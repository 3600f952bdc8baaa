"""The engine of one expert-parallel rank: the single-process Engine with its MoE layers sharded.

Every rank runs this same loop on the same requests: scheduling, sampling and the dense parts are
replicated and deterministic (seeded per request), so the ranks stay in lockstep and call the
layers' collectives in the same order. Only the routed experts are split between ranks.

Each rank builds only the experts it hosts (local_model.py): the dense parts, router and shared
expert in full, the routed experts of its placement, with the weights the single-process model
has (the same seeded init, or the same weights file read for those tensors only).
"""
from __future__ import annotations

from typing import Mapping

from infersight.runtime.config import EngineConfig
from infersight.runtime.engine.engine import Engine
from infersight.runtime.model.transformer import Transformer
from infersight.runtime.observer import EngineObserver
from infersight.runtime.parallel.group import EPGroup
from infersight.runtime.parallel.local_model import build_local_model
from infersight.runtime.parallel.moe import ExpertParallelMoE
from infersight.runtime.parallel.placement import LayerPlacement
from infersight.runtime.parallel.stats import EPLayerStats, EPStatsCollector
from infersight.runtime.stats import StepStats


class ExpertParallelEngine(Engine):
    """Engine whose target model's MoE layers run expert-parallel over `group`.

    After each step the layers' stats go to the observer's on_ep_stats (ProbeObserver writes them
    as EP_STATS records) and stay readable as `last_ep_stats`. A speculative draft model, if any,
    stays replicated."""

    def __init__(self, config: EngineConfig, group: EPGroup, observer: EngineObserver | None = None,
                 placements: Mapping[int, LayerPlacement] | None = None) -> None:
        if not config.model_config.is_moe:
            raise ValueError(f"model {config.model_config.name!r} has no experts to shard")
        # Read by build_target, which Engine.__init__ calls.
        self.group, self.placements = group, placements
        self.ep_stats = EPStatsCollector(group.rank, group.world, config.device)
        super().__init__(config, observer)
        self.ep_layers = [layer.ffn for layer in self.target.model.layers if isinstance(layer.ffn, ExpertParallelMoE)]
        self.last_ep_stats: list[EPLayerStats] = []

    def build_target(self, config: EngineConfig, attention_backend: str, decode_attention: str) -> Transformer:
        """Only this rank's experts (local_model.build_local_model)."""
        return build_local_model(config, self.group, self.ep_stats, self.ranges, self.placements,
                                 attention_backend=attention_backend, decode_attention=decode_attention)

    def step(self) -> StepStats:
        stats = super().step()
        self.last_ep_stats = self.ep_stats.flush(stats.step_id, self.observer)
        return stats
