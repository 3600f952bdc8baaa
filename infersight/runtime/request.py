"""A request's state inside the engine: its tokens, how many have KV, and its monotonic timestamps."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from infersight.runtime.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"      # preempted with its KV in the CPU tier
    FINISHED = "finished"


@dataclass
class RequestTimes:
    """Monotonic-ns timestamps (time.monotonic_ns, one process); the sidecar turns them into intervals."""

    arrival_ns: int
    first_scheduled_ns: int | None = None
    prefill_chunks: list[tuple[int, int, int]] = field(default_factory=list)  # (start_ns, end_ns, tokens)
    first_token_ns: int | None = None
    preemptions: list[tuple[int, str]] = field(default_factory=list)  # (ns, "recompute" | "swap")
    resumptions: list[int] = field(default_factory=list)
    finish_ns: int | None = None


@dataclass
class Request:
    """Token layout: token_ids = prompt + output. KV exists for positions [0, num_computed).

    The last token never has KV until the next step feeds it, so a decoding request has
    num_computed == len(token_ids) - 1. draft_computed is the same count for the draft model."""

    request_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    arrival_ns: int
    trace_id: int = 0
    task: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0          # leading blocks already registered in the prefix cache
    num_computed: int = 0
    draft_computed: int = 0
    num_prefix_hit_tokens: int = 0
    num_preemptions: int = 0
    num_spec_proposed: int = 0
    num_spec_accepted: int = 0
    finish_reason: str | None = None
    times: RequestTimes = field(init=False)

    def __post_init__(self) -> None:
        self.times = RequestTimes(arrival_ns=self.arrival_ns)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def in_prefill(self) -> bool:
        return self.num_uncomputed > 1

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
