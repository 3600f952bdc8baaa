"""Which decode steps run without speculation, so that a plain step can be timed beside a speculative one.

An engine with a draft model never runs a plain decode step, so the baseline that speculation
must beat cannot be observed. SpecProbe picks a bounded, counted share of pure-decode steps
(every request in the batch decoding, at least one drafting) to run without drafting: at each
batch size b, the 1st, (N+1)th, (2N+1)th ... such step (N = EngineConfig.spec_probe_every).

    pure-decode steps at b = 3:   1  2  3  4  5  6  7  8  9 ...     (N = 4)
    run plain:                    P  .  .  .  P  .  .  .  P

So a batch size has a plain sample as soon as it has a speculative one, and the plain share at
a batch size seen n times is ceil(n / N) / n, tending to 1/N. Tokens stay exactly distributed:
a plain step samples from the target, as an engine without a draft would.
"""
from __future__ import annotations

from typing import Sequence

from infersight.runtime.engine.scheduler import ScheduledRequest


class SpecProbe:
    """The rule above; counts per batch size (at most max_num_seqs of them)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.decode_steps_at: dict[int, int] = {}  # batch size -> pure-decode steps with drafts seen
        self.num_probes = 0

    def runs_plain(self, scheduled: Sequence[ScheduledRequest], prefilling: set[int]) -> bool:
        """Count this step if it is pure decode with drafts, and say whether it runs without them."""
        if not self.every or prefilling or not any(s.num_spec_tokens for s in scheduled):
            return False
        b = len(scheduled)
        seen = self.decode_steps_at.get(b, 0)
        self.decode_steps_at[b] = seen + 1
        plain = seen % self.every == 0
        self.num_probes += plain
        return plain
