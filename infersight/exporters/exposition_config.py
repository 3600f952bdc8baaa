"""ExpositionConfig: how /metrics renders what the agent folded, and its CLI flags."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from infersight.config_error import ConfigError


@dataclass(frozen=True)
class ExpositionConfig:
    """max_expert_series: per-(layer, expert) series only while layers x experts <= this; beyond it the
    exposition sums over layers and adds the top_hot_pairs hottest pairs. vllm_compat: also serve
    vLLM's metric names, labelled model_name (which every engine family also carries, and spans too)."""

    max_expert_series: int = 512
    top_hot_pairs: int = 10
    vllm_compat: bool = False
    model_name: str = "tiny-moe"

    def __post_init__(self) -> None:
        if self.max_expert_series < 1:
            raise ConfigError(f"--max-expert-series must be >= 1, got {self.max_expert_series}")
        if self.top_hot_pairs < 1:
            raise ConfigError(f"top_hot_pairs must be >= 1, got {self.top_hot_pairs}")

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        exposition = parser.add_argument_group("the /metrics exposition")
        exposition.add_argument("--vllm-compat", action="store_true", help="also serve vLLM metric names")
        exposition.add_argument("--model-name", default="tiny-moe",
                                help="model_name label of the vLLM-compatible view")
        exposition.add_argument("--max-expert-series", type=int, default=512, help="cap on layers x experts series")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExpositionConfig:
        return cls(max_expert_series=args.max_expert_series, vllm_compat=args.vllm_compat,
                   model_name=args.model_name)
