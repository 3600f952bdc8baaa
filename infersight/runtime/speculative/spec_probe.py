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

Mixed steps (prefill chunks beside decoding requests, at least one drafting) are probed by the same
rule, counted apart by the number of decoding requests: a plain engine runs them too, and their
cost without a draft cannot be read off a speculative mixed step. On CUDA a plain pure-decode step
is a graph replay (~1 ms for the demo's model on an H200) while a mixed step runs eagerly (~9 ms):
taking the speculative mixed step less its draft phase and the pure steps' verify extra put the
plain mixed step at ~2.6 ms, and predicted speedups 32-48% low at batch 16 (2026-12-03, seed 1;
BENCHMARKS.md).
"""
from __future__ import annotations

from typing import Sequence

from infersight.runtime.engine.scheduler import ScheduledRequest


class SpecProbe:
    """The rule above; counts per batch size (at most max_num_seqs of them, for each kind of step)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.decode_steps_at: dict[int, int] = {}  # batch size -> pure-decode steps with drafts seen
        self.mixed_steps_at: dict[int, int] = {}   # decoding requests -> mixed steps with drafts seen
        self.num_probes = 0        # plain steps run, of both kinds
        self.num_mixed_probes = 0  # of which mixed

    def runs_plain(self, scheduled: Sequence[ScheduledRequest], prefilling: set[int]) -> bool:
        """Count this step if it has drafts (pure decode, or mixed), and say whether it runs without them."""
        if not self.every or not any(s.num_spec_tokens for s in scheduled):
            return False
        counts = self.mixed_steps_at if prefilling else self.decode_steps_at
        b = len(scheduled) - len(prefilling)  # prefilling: those of `scheduled` in prefill
        seen = counts.get(b, 0)
        counts[b] = seen + 1
        plain = seen % self.every == 0
        self.num_probes += plain
        self.num_mixed_probes += plain and bool(prefilling)
        return plain
