"""EngineLabelConfig: whether the engine families carry an `engine` label (agent.rings.engine_scope), and its flag."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from infersight.config_error import ConfigError

MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class EngineLabelConfig:
    """mode: on, off, or auto: on when the agent may read several rings (more than one --ring, or
    --discover), off with a single --ring, whose exposition is then exactly what it was before the
    label existed."""

    mode: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--engine-label must be one of {', '.join(MODES)}, got {self.mode!r}")

    def enabled(self, rings: int, discover: bool) -> bool:
        """Whether the label is on for an agent given `rings` ring names and discover."""
        if self.mode == "auto":
            return discover or rings > 1
        return self.mode == "on"

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("engines")
        group.add_argument("--engine-label", default="auto", choices=MODES,
                           help="an `engine` label on every engine family, valued with the name each ring's "
                                "engine announces (serve --engine-name, vLLM's INFERSIGHT_ENGINE_NAME; default: "
                                "the ring's name). auto (default): on with several --ring or --discover, off "
                                "with one --ring")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineLabelConfig:
        return cls(args.engine_label)
