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

With runs of R (EngineConfig.spec_probe_run) the pure-decode probes come R in a row: a run starts at
the 1st, (NR+1)th ... step at a batch size and its next R-1 pure-decode steps run plain too, whatever
their batch size (each counted at its own), so the share stays 1/N. Why runs: under async
scheduling a plain engine launches each decode step before reading the one before, so its step costs
about max(host, device) where a lone plain step of a speculative engine, run synchronously, costs host
+ device (on the H100, 2026-12-05, 0.75 against 0.45 ms at batch 1, but in an A/B since found to time the
async plain engine too fast: BENCHMARKS.md). The engine launches a
run's steps after its first ahead (Engine._launch_next), and a middle step of the run, launched ahead
and itself followed by one launched ahead, is the plain engine's steady step (StepStats.launched_next).
A run ends early at a step that is not pure decode (a prefill joins: mixed steps are single probes).

    pure-decode steps at b = 3:   1  2  3  4  5  6  7  8  9 ...  (N = 2, R = 2)
    run plain:                    P  P  .  .  P  P  .  .  P

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

    def __init__(self, every: int, run: int = 1) -> None:
        self.every = every
        self.run = max(1, run)
        self.run_left = 0  # pure-decode steps still to run plain in the current run
        self.decode_steps_at: dict[int, int] = {}  # batch size -> pure-decode steps with drafts seen
        self.mixed_steps_at: dict[int, int] = {}   # decoding requests -> mixed steps with drafts seen
        self.num_probes = 0        # plain steps run, of both kinds
        self.num_mixed_probes = 0  # of which mixed

    def runs_plain(self, scheduled: Sequence[ScheduledRequest], prefilling: set[int]) -> bool:
        """Count this step if it has drafts (pure decode, or mixed), and say whether it runs without them."""
        if not self.every or not any(s.num_spec_tokens for s in scheduled):
            return False
        b = len(scheduled) - len(prefilling)  # prefilling: those of `scheduled` in prefill
        if prefilling:
            self.run_left = 0
            seen = self.mixed_steps_at.get(b, 0)
            self.mixed_steps_at[b] = seen + 1
            plain = seen % self.every == 0
        elif self.run_left:
            self.run_left -= 1
            self.decode_steps_at[b] = self.decode_steps_at.get(b, 0) + 1
            plain = True
        else:
            seen = self.decode_steps_at.get(b, 0)
            self.decode_steps_at[b] = seen + 1
            plain = seen % (self.every * self.run) == 0
            if plain:
                self.run_left = self.run - 1
        self.num_probes += plain
        self.num_mixed_probes += plain and bool(prefilling)
        return plain

    def continues_run(self) -> bool:
        """Whether the pure-decode step after a plain one runs plain too (a run goes on); the engine
        asks before launching it ahead, and then counts it (launched_in_run) or ends the run (end_run)."""
        return self.run_left > 0

    def launched_in_run(self, batch: int) -> None:
        """Count a run's step the engine launched ahead (it passed no runs_plain) at its batch size."""
        assert self.run_left > 0
        self.run_left -= 1
        self.decode_steps_at[batch] = self.decode_steps_at.get(batch, 0) + 1
        self.num_probes += 1

    def end_run(self) -> None:
        """The run stops short (the step after could not be launched ahead: a request arrived, KV ran low)."""
        self.run_left = 0
