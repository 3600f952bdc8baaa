"""`infersight bench serving`'s arms and its one config object (bench.serving runs it)."""
from __future__ import annotations

from dataclasses import dataclass

ARMS = ("none", "none_again", "agent", "agent_recorder", "full")
REFERENCE = "none"


@dataclass(frozen=True)
class ServingBenchConfig:
    model: str = "tiny-moe"
    device: str = "cpu"
    dtype: str = "auto"
    clients: int = 8
    max_tokens: int = 32
    prompt_chars: tuple[int, int] = (32, 400)
    phase_s: float = 20.0
    warmup_s: float = 3.0
    rounds: int = 5
    arms: tuple[str, ...] = ARMS
    seed: int = 0
    serve_args: tuple[str, ...] = ()  # more `infersight serve` flags (the engine's, e.g. --scheduler-delay-factor)
    agent_args: tuple[str, ...] = ()  # more `infersight agent` flags for every agent arm (e.g. --recorder-initial-cost)

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or REFERENCE not in self.arms:
            raise ValueError(f"arms are some of {', '.join(ARMS)} and include {REFERENCE!r}; got {list(self.arms)}")
        if self.phase_s <= self.warmup_s or self.warmup_s < 0:
            raise ValueError(f"--phase-s ({self.phase_s}) must exceed --warmup-s ({self.warmup_s}) >= 0")
        if self.clients < 1 or self.rounds < 1 or self.max_tokens < 1:
            raise ValueError("--clients, --rounds and --max-tokens are at least 1")
