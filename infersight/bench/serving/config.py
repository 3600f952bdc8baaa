"""`infersight bench serving`'s arms and its one config object (bench.serving.run runs it)."""
from __future__ import annotations

from dataclasses import dataclass

ARMS = ("none", "none_again", "agent", "agent_recorder", "full")
REFERENCE = "none"
#: The switchback's calibration arm (config.calibration_pause): not an observer, a known loss.
CALIBRATION_ARM = "engine_paused"
#: Its pause period: one stop of calibration_pause x this every period. Long beside a decode step (1-2 ms on the
#: H200, ~15 ms on the CPU) so the work queued on a GPU when the engine stops absorbs little of the pause.
PAUSE_PERIOD_S = 0.5


@dataclass(frozen=True)
class ServingBenchConfig:
    model: str = "tiny-moe"
    device: str = "cpu"
    dtype: str = "auto"
    clients: int = 8
    max_tokens: int = 32
    # Each request's output length drawn from max_tokens x [1 - spread, 1 + spread] (0: every request the same).
    # Equal lengths keep closed-loop clients in lockstep: on the H200 at 48 clients they finished, and
    # prefilled, together, in waves of ~0.5 s that a 1-s switchback block holds 2 or 3 of.
    max_tokens_spread: float = 0.0
    prompt_chars: tuple[int, int] = (32, 400)
    phase_s: float = 20.0
    warmup_s: float = 3.0
    rounds: int = 5
    arms: tuple[str, ...] = ARMS
    seed: int = 0
    serve_args: tuple[str, ...] = ()  # more `infersight serve` flags (the engine's, e.g. --scheduler-delay-factor)
    agent_args: tuple[str, ...] = ()  # more `infersight agent` flags for every agent arm (e.g. --recorder-initial-cost)
    # Switchback (bench.serving.switchback_run): > 0 runs each arm as one long phase of `switchback_pairs` pairs of
    # blocks this long, the arm paused (SIGSTOP) in one block of each pair, instead of phases per arm.
    switchback_block_s: float = 0.0
    switchback_pairs: int = 30
    # The switchback's calibration arm `engine_paused`: serve's engine stopped for this share of each
    # PAUSE_PERIOD_S in its on blocks, a loss known in advance that the method must read back (0: no such arm).
    calibration_pause: float = 0.0

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or REFERENCE not in self.arms:
            raise ValueError(f"arms are some of {', '.join(ARMS)} and include {REFERENCE!r}; got {list(self.arms)}")
        if self.phase_s <= self.warmup_s or self.warmup_s < 0:
            raise ValueError(f"--phase-s ({self.phase_s}) must exceed --warmup-s ({self.warmup_s}) >= 0")
        if self.clients < 1 or self.rounds < 1 or self.max_tokens < 1:
            raise ValueError("--clients, --rounds and --max-tokens are at least 1")
        if not 0.0 <= self.max_tokens_spread < 1.0:
            raise ValueError(f"--max-tokens-spread is in [0, 1), got {self.max_tokens_spread}")
        if self.switchback_block_s < 0 or (self.switchback_block_s > 0 and self.switchback_pairs < 5):
            raise ValueError("--switchback-block-s is >= 0 (0: phases) and --switchback-pairs at least 5 "
                             "(the fewest that give the median's 90% interval)")
        if not 0.0 <= self.calibration_pause < 0.5:
            raise ValueError(f"--calibration-pause is a share of engine time in [0, 0.5), got {self.calibration_pause}")
        if self.switchback_block_s > 0 and len(set(self.arms) - {REFERENCE}) == 0 and self.calibration_pause == 0:
            raise ValueError("a switchback needs an arm besides none (none_again is the A/A) or --calibration-pause")
        if self.calibration_pause > 0 and self.switchback_block_s <= 0:
            raise ValueError("--calibration-pause needs --switchback-block-s (its arm runs in switchback blocks)")
