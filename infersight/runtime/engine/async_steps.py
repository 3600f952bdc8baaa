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

AsyncSteps launches steps and reads their tokens back; the engine owns one (when async scheduling
is on), passes what each call needs, and keeps what it does with a step's tokens (commit, failures,
the step's end), as for a synchronous step.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from infersight.runtime.engine.sampling import probs_from_logits, sample, sample_batch
from infersight.runtime.engine.scheduler import ScheduledRequest
from infersight.runtime.runner.forward_timer import ForwardTimer
from infersight.runtime.runner.model_runner import FeedItem
from infersight.runtime.stats import StepStats

if TYPE_CHECKING:
    from infersight.runtime.engine.scheduler import Scheduler
    from infersight.runtime.ranges import RangeMarker
    from infersight.runtime.runner.model_runner import ModelRunner

log = logging.getLogger("infersight.runtime")

#: Host buffers for the in-flight steps' own expert counts (AsyncSteps): one step in flight and one launched
#: beside it use two; the third is slack should a read come a step later.
COUNT_BUFFERS = 3


@dataclass(slots=True)
class InflightStep:
    """A launched decode step whose tokens have not been read yet."""

    stats: StepStats
    sched: list[ScheduledRequest]
    tokens: torch.Tensor               # [len(sched)] its tokens, on the device
    slot: int                          # TokenReadback slot holding their host copy
    timer: ForwardTimer
    expert_counts: torch.Tensor | None  # this step's own copy, on the host once its tokens are read
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


class AsyncSteps:
    """Launches decode steps without reading them and reads their tokens back later.

    target: the engine's target runner; scheduler: plans the step after one in flight
    (schedule_lookahead); expert_counts: the engine's per-step MoE counter buffer, or None; the
    engine's max_model_len and max_num_seqs bound what a step may hold."""

    def __init__(self, target: "ModelRunner", scheduler: "Scheduler", ranges: "RangeMarker",
                 expert_counts: torch.Tensor | None, max_model_len: int, max_num_seqs: int, device: str) -> None:
        self.target = target
        self.scheduler = scheduler
        self.ranges = ranges
        self.expert_counts = expert_counts
        # Each launched step's own counts, copied to the host behind its forward and ahead of its tokens' copy,
        # so they are there when its tokens are (TokenReadback.take waits for the later copy): the observer gets
        # host counts and needs no copy or event of its own (on an H100 those torch calls were most of what
        # expert counts cost a 0.4-ms tiny-moe step). Pinned buffers taken in turn (pinned allocation is slow):
        # a step's buffer is read (its observer copies it) before the step after the next is launched, whose
        # copy into it comes later.
        self._counts = ([torch.empty(tuple(expert_counts.shape), dtype=expert_counts.dtype,
                                     pin_memory=expert_counts.is_cuda) for _ in range(COUNT_BUFFERS)]
                        if expert_counts is not None else [])
        self._next_counts = 0
        self.max_model_len = max_model_len
        self.readback = TokenReadback(max_num_seqs, device)
        self.launched_ahead = 0  # steps launched before the step before them was read

    def launch(self, sched: list[ScheduledRequest], stats: StepStats, items: list[FeedItem]) -> InflightStep:
        """Start a decode step whose tokens are on the host (items: what the target is fed); read nothing."""
        return self._launch(sched, stats, items, None)

    def launch_next(self, pending: InflightStep, step_id: int) -> InflightStep | None:
        """Step `step_id`, the one after `pending`, launched before pending is read, where that is
        steady decode; None where it is not (the engine then runs its next step synchronously)."""
        if torch.autograd.profiler._is_profiler_enabled:
            return None
        t0 = time.monotonic_ns()
        reqs = continuing(pending, self.max_model_len)
        sched = self.scheduler.schedule_lookahead(reqs) if reqs else None
        if sched is None:
            return None
        stats = StepStats(step_id, t0, t0, launched_ahead=True)
        self.launched_ahead += 1
        reqs = [s.req for s in sched]
        items = [FeedItem(r, r.num_computed + 1, [0], 1) for r in reqs]
        return self._launch(sched, stats, items, pending)

    def read(self, pending: InflightStep) -> list[int]:
        """A launched step's tokens (waits for their copy), one per row; sets its forward time."""
        tokens = self.readback.take(pending.slot, len(pending.sched))
        pending.stats.target_ns = pending.timer.elapsed_ns()
        return tokens

    def _launch(self, sched: list[ScheduledRequest], stats: StepStats, items: list[FeedItem],
                prev: InflightStep | None) -> InflightStep:
        """Start a decode step on the device and its tokens' copy back; read nothing.
        prev: the step still in flight whose tokens this one feeds (None: they are on the host)."""
        if self.expert_counts is not None:
            self.expert_counts.zero_()
        src, tokens_in = (prev.src_of([s.req for s in sched]), prev.tokens) if prev is not None else (None, None)
        stats.schedule_ns = time.monotonic_ns() - stats.start_ns
        stats.phase = "decode"
        slot = self.readback.next_slot()
        timer = self.readback.timers[slot]
        captures = self.target.num_captures
        with self.ranges.range("forward.decode"):
            timer.start()
            self.target.run(items, self.expert_counts, False, src, tokens_in)
            timer.stop()
        stats.graph_captures = self.target.num_captures - captures
        stats.profiled = torch.autograd.profiler._is_profiler_enabled
        tokens, failed = self._draw(sched, prev is not None, stats.step_id)
        counts = None
        if self.expert_counts is not None:
            counts = self._counts[self._next_counts]
            self._next_counts = (self._next_counts + 1) % COUNT_BUFFERS
            counts.copy_(self.expert_counts, non_blocking=True)  # before the tokens' copy: read with them
        self.readback.send(slot, tokens)
        return InflightStep(stats, sched, tokens, slot, timer, counts, failed)

    def _draw(self, sched: list[ScheduledRequest], behind: bool,
              step_id: int) -> tuple[torch.Tensor, dict[int, Exception]]:
        """The step's tokens on the device, and the rows whose draw failed (row -> error). Sampled
        rows are keyed as the synchronous engine keys them (seed, tokens drawn before); `behind`:
        the step in flight adds one to each. Should the batched draw raise, each row is drawn as the
        synchronous engine then draws it (its own generator, on the host); a row that raises there
        gets a placeholder token and fails its request when the step is read."""
        reqs = [s.req for s in sched]
        if all(r.params.greedy for r in reqs):
            tokens = self.target.device_tokens
            if tokens is None:
                tokens = self.target.last_logits.argmax(-1)  # an eager step (sample_batch's greedy rule)
            return tokens, {}
        logits = self.target.last_logits
        try:
            return sample_batch(logits, [r.params for r in reqs], [r.generator.initial_seed() for r in reqs],
                                [len(r.output_token_ids) + behind for r in reqs]), {}
        except Exception:  # noqa: BLE001 -- see the docstring
            log.exception("step %d: batched sampling failed; sampling request by request", step_id)
        drawn, failed = [], {}
        for i, r in enumerate(reqs):
            try:
                drawn.append(sample(probs_from_logits(logits[i:i + 1], r.params)[0], r.generator))
            except Exception as exc:  # noqa: BLE001 -- this request's failure ends this request only
                drawn.append(0)
                failed[i] = exc
        return torch.tensor(drawn, dtype=torch.long, device=logits.device), failed
