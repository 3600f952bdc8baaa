"""Async scheduling (vLLM's --async-scheduling): the host plans and launches decode step N+1 while
step N still runs on the device, then reads N's tokens and does N's bookkeeping behind N+1.

    synchronous   host: [plan N][launch N] wait .......... [read N, emit, commit][plan N+1][launch N+1] wait ...
                  GPU:                    [---- N ----]                                              [-- N+1 --]
    async         host: [plan N+1][launch N+1][read N, emit, commit] [plan N+2][launch N+2][read N+1 ...]
                  GPU:  [---- N ----][---- N+1 ----][---- N+2 ----]

Step N+1 feeds each request the token N leaves on the device (ModelRunner.run's src/prev), at the
position after N's. Which requests N+1 holds is known before N's tokens are: all of N's, less those
that N ends by length (max_tokens, max_model_len). One that N ends with EOS is discovered only when
N is read: N+1 has then computed one token too many for it, which is dropped; its KV write went to
the request's last, partial block (never a prefix-cache block), and any reuse of that block comes
later on the same stream. Only steady decode is launched ahead (Scheduler.schedule_lookahead);
everything else runs as before, one step at a time. Each step() still returns one finished step:
its interval runs from the end of the step before (the steps tile the engine's time).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from infersight.runtime.runner.forward_timer import ForwardTimer
from infersight.runtime.engine.scheduler import ScheduledRequest
from infersight.runtime.stats import StepStats


@dataclass(slots=True)
class InflightStep:
    """A launched decode step whose tokens have not been read yet."""

    stats: StepStats
    sched: list[ScheduledRequest]
    tokens: torch.Tensor               # [len(sched)] its tokens, on the device
    slot: int                          # TokenReadback slot holding their host copy
    timer: ForwardTimer
    expert_counts: torch.Tensor | None  # this step's own copy (the engine's buffer is the next step's)
    failed: dict[int, Exception]       # rows whose draw raised (AsyncSteps._draw): their requests fail when read

    def src_of(self, reqs: list) -> list[int]:
        """For each of reqs (all in this step), the row of this step whose token it feeds next."""
        row = {id(s.req): i for i, s in enumerate(self.sched)}
        return [row[id(r)] for r in reqs]

    def all_finished(self) -> bool:
        return all(s.req.is_finished for s in self.sched)


class TokenReadback:
    """Each launched step's tokens copied to the host behind its work, in two pinned buffers used in
    turn: a step's copy must not land in the buffer of the step before, which is read after the
    next one is launched. On the CPU the tokens are read where they are."""

    def __init__(self, max_batch: int, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self._turn = 0
        self._host = [torch.zeros(max_batch, dtype=torch.long, pin_memory=self.cuda) for _ in range(2)]
        self._done = [torch.cuda.Event() for _ in range(2)] if self.cuda else []
        self._cpu: list[torch.Tensor | None] = [None, None]
        self.timers = [ForwardTimer(device), ForwardTimer(device)]

    def next_slot(self) -> int:
        self._turn ^= 1
        return self._turn

    def send(self, slot: int, tokens: torch.Tensor) -> None:
        if self.cuda:
            self._host[slot][:len(tokens)].copy_(tokens, non_blocking=True)
            self._done[slot].record()
        else:
            self._cpu[slot] = tokens

    def take(self, slot: int, n: int) -> list[int]:
        """The tokens of the step sent to slot (waits for its copy)."""
        if self.cuda:
            self._done[slot].synchronize()
            return self._host[slot][:n].tolist()
        tokens = self._cpu[slot]
        assert tokens is not None
        self._cpu[slot] = None
        return tokens[:n].tolist()


def launchable(sched: list[ScheduledRequest]) -> bool:
    """A step that async scheduling may launch without reading it back at once: every request
    decodes one token (no prefill, no drafts), and torch.profiler is not recording."""
    if torch.autograd.profiler._is_profiler_enabled:
        return False
    for s in sched:
        req = s.req
        if s.num_new_tokens != 1 or s.num_spec_tokens or not s.samples or not req.output_token_ids:
            return False
    return True


def continuing(step: InflightStep, max_model_len: int) -> list:
    """The requests of a step in flight that go on after it: not finished, and not ended by length
    by the one token it adds (an EOS it may produce is not known yet: see the module docstring)."""
    out = []
    for s in step.sched:
        req = s.req
        if req.is_finished:
            continue
        if len(req.output_token_ids) + 1 >= req.params.max_tokens or req.num_tokens + 1 >= max_model_len:
            continue
        out.append(req)
    return out
