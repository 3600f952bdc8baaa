"""RecordLimits: the agent's own caps on what a producer sends (agent.rings.record_limits screens by them),
and their CLI flags."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from infersight.config_error import ConfigError


@dataclass(frozen=True)
class RecordLimits:
    """max_task_labels: distinct task names over all rings ("other" not counted); max_moe_layers,
    max_moe_experts: the expert-load matrix is at most this big (layer ids 0..max-1, experts per layer);
    max_tokens_per_event: the most tokens one TOKENS event may claim (a step emits one token per
    request plus its accepted drafts: 4096 is far above any engine, and the ITL fold makes a row per
    token, so a claim of 2^63 must not reach it)."""

    max_task_labels: int = 64
    max_moe_layers: int = 256
    max_moe_experts: int = 1024
    max_tokens_per_event: int = 4096

    def __post_init__(self) -> None:
        for flag, value in (("--max-task-labels", self.max_task_labels), ("--max-moe-layers", self.max_moe_layers),
                            ("--max-moe-experts", self.max_moe_experts),
                            ("max_tokens_per_event", self.max_tokens_per_event)):
            if value < 1:
                raise ConfigError(f"{flag} must be >= 1, got {value}")

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        limits = parser.add_argument_group("limits on what an engine sends (beyond them: refused, counted)")
        limits.add_argument("--max-task-labels", type=int, default=64, metavar="N",
                            help="distinct task labels over all rings; further ones count as \"other\" (default 64)")
        limits.add_argument("--max-moe-layers", type=int, default=256, metavar="N",
                            help="MoE records of layer N or above are refused and counted (default 256)")
        limits.add_argument("--max-moe-experts", type=int, default=1024, metavar="N",
                            help="MoE records of layers with more experts are refused and counted (default 1024)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RecordLimits:
        return cls(args.max_task_labels, args.max_moe_layers, args.max_moe_experts)
