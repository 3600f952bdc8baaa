"""The engine's run-time policy: which tasks speculate (with a canary's control arm) and the
scheduler's max_num_seqs, as set by an agent while the engine runs (probes.policy_block carries it).

A request's arm is drawn once, when it arrives, and kept for its life:

    task has no policy                 -> the engine's default (speculate when it has a draft), arm NONE
    draw <  control_share              -> old_speculate, arm CONTROL (the canary's baseline)
    draw >= control_share              -> speculate,     arm TREATMENT (the change)

So a change never switches a request half-way, and the two arms of a task run side by side in the
same window, on the same load: what the agent compares.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

#: The longest task label a policy names (the probes' TASK_LABEL record holds 32 bytes).
LABEL_BYTES = 32


class PolicyArm(enum.IntEnum):
    NONE = 0        # the task has no policy: the engine's default
    TREATMENT = 1   # the policy's new setting
    CONTROL = 2     # the canary's share that keeps the old setting


@dataclass(frozen=True)
class TaskPolicy:
    """One task's speculation policy: `speculate` for the treatment arm; a share `control_share` of
    the task's requests (at random) keeps `old_speculate`."""

    label: str
    speculate: bool
    old_speculate: bool = True
    control_share: float = 0.0

    def __post_init__(self) -> None:
        if not self.label or len(self.label.encode()) > LABEL_BYTES:
            raise ValueError(f"a task label must be 1..{LABEL_BYTES} UTF-8 bytes, got {self.label!r}")
        if not 0.0 <= self.control_share <= 1.0:
            raise ValueError(f"control_share must be in [0, 1], got {self.control_share}")


@dataclass(frozen=True)
class RunPolicy:
    """seq: the agent's generation number (0: none set); max_num_seqs: the scheduler's limit (0: the
    configured one); tasks: the tasks with a speculation policy."""

    seq: int = 0
    max_num_seqs: int = 0
    tasks: tuple[TaskPolicy, ...] = ()

    def arm(self, task: str | None, draw: float) -> tuple[bool | None, PolicyArm]:
        """(speculate, arm) of a request of `task`; draw: uniform in [0, 1). speculate None: the
        engine's default."""
        for t in self.tasks:
            if t.label == task:
                if draw < t.control_share:
                    return t.old_speculate, PolicyArm.CONTROL
                return t.speculate, PolicyArm.TREATMENT
        return None, PolicyArm.NONE

    def seq_limit(self, configured: int) -> int:
        """The scheduler's max_num_seqs under this policy: within 1..configured (buffers and CUDA
        graphs are sized for the configured limit, so the policy can only lower it)."""
        return configured if self.max_num_seqs <= 0 else max(1, min(self.max_num_seqs, configured))
