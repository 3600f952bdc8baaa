"""Iteration-level continuous batching under a per-step token budget, with chunked prefill and
preemption (swap to the CPU tier when it has room, else recompute) when KV blocks run out.

Each step: running requests first (oldest first), then swapped ones coming back, then waiting
ones being admitted. A request that cannot get blocks preempts the newest running request,
possibly itself. A step that preempted admits nothing new, so the freed blocks go to the
requests already in flight.

With scheduler_delay_factor > 0 (vLLM's flag), waiting requests are admitted only once the oldest
has waited that many times the last prefill step's duration, or when nothing runs: arrivals are
gathered into fewer prefill steps, and the steps between stay pure decode (on CUDA, graph replays
launched ahead) instead of each carrying one new prompt eagerly.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from infersight.runtime.config import EngineConfig
from infersight.runtime.kv.kv_cache import KVCacheManager
from infersight.runtime.observer import EngineObserver
from infersight.runtime.engine.request import Request, RequestStatus


@dataclass(slots=True, init=False)
class ScheduledRequest:
    """Feed num_new_tokens known tokens (from num_computed on), plus num_spec_tokens draft proposals."""

    req: Request
    num_new_tokens: int
    num_spec_tokens: int
    samples: bool  # this step reaches the request's last token: logits needed

    def __init__(self, req: Request, num_new_tokens: int, num_spec_tokens: int = 0) -> None:
        # One call per scheduled request and step, written out (the dataclass's __init__ and
        # __post_init__ were two, with a property behind): the engine's host time per step.
        self.req, self.num_new_tokens, self.num_spec_tokens = req, num_new_tokens, num_spec_tokens
        self.samples = req.num_computed + num_new_tokens == len(req.prompt_token_ids) + len(req.output_token_ids)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    swapped_in: int = 0  # requests brought back from the CPU tier

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens + s.num_spec_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager, observer: EngineObserver,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.config = config
        self.clock = clock  # monotonic ns: the admission delay's and the requests' timestamps
        self.max_num_seqs = config.max_num_seqs  # lowered at run time by a policy (Engine.apply_policy)
        self.kv = kv
        self.observer = observer
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.max_seq_len = config.max_model_len  # type: ignore[assignment]  # resolved in EngineConfig
        self.last_prefill_ns = 0  # the last step that admitted a request: from its schedule() to the next one
        self._admitted_at_ns: int | None = None

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def _num_spec_tokens(self, req: Request) -> int:
        """Draft tokens to propose: none while prefilling, and never past max_tokens or max length."""
        if self.config.draft_config is None or not req.params.use_speculation or req.in_prefill:
            return 0
        room_out = req.params.max_tokens - len(req.output_token_ids) - 1
        room_len = self.max_seq_len - req.num_tokens - 1
        return max(0, min(self.config.num_speculative_tokens, room_out, room_len))

    def _plan(self, req: Request, budget: int) -> tuple[int, int]:
        uncomputed = len(req.prompt_token_ids) + len(req.output_token_ids) - req.num_computed  # req.num_uncomputed
        if uncomputed > 1:  # req.in_prefill
            return min(uncomputed, budget), 0
        if self.config.draft_config is None:  # the common decode: no draft tokens to plan
            return 1, 0
        spec = min(self._num_spec_tokens(req), budget - 1)
        return 1, spec

    def admission_open(self, now_ns: int) -> bool:
        """Whether waiting requests may be admitted now (see the module's note on the delay)."""
        factor = self.config.scheduler_delay_factor
        if factor <= 0 or not self.running or not self.waiting:
            return True
        return now_ns - self.waiting[0].times.arrival_ns >= factor * self.last_prefill_ns

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        now = self.clock()
        if self._admitted_at_ns is not None:
            self.last_prefill_ns, self._admitted_at_ns = now - self._admitted_at_ns, None
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n, spec = self._plan(req, budget)
            if not self.kv.blocks_needed(req, n + spec):  # most decode steps: the last block has room
                out.scheduled.append(ScheduledRequest(req, n, spec))
                budget -= n + spec
                i += 1
                continue
            while not self.kv.can_allocate_slots(req, n + spec):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                self.kv.allocate_slots(req, n + spec)
                out.scheduled.append(ScheduledRequest(req, n, spec))
                budget -= n + spec
                i += 1
                continue
            break
        if out.preempted:
            return out
        while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.swapped[0]
            n, spec = self._plan(req, budget)
            blocks = len(self.kv.cpu_tables[req.request_id])
            extra = -(-(req.num_computed + n + spec) // self.kv.block_size) - blocks
            if not self.kv.pool.can_allocate(blocks + max(0, extra)):
                break
            self.swapped.popleft()
            self.kv.swap_in(req)
            out.swapped_in += 1
            self.kv.allocate_slots(req, n + spec)
            self._resume(req)
            out.scheduled.append(ScheduledRequest(req, n, spec))
            budget -= n + spec
        admit = self.admission_open(now)  # judged once: the oldest's wait opens it for all who came since
        while admit and self.waiting and not self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            hits = self.kv.find_prefix_hits(req)
            n = min(req.num_tokens - len(hits) * self.kv.block_size, budget)
            if not self.kv.can_admit(req, hits, n):
                break
            self.waiting.popleft()
            self.kv.admit(req, hits)
            self.kv.allocate_slots(req, n)
            self._admitted_at_ns = now
            if req.times.first_scheduled_ns is None:
                req.num_prefix_hit_tokens = req.num_computed
                req.times.first_scheduled_ns = now
                self.observer.on_request_scheduled(req.request_id, now, len(req.prompt_token_ids),
                                                   req.num_computed, self.kv.prefix_group_hash(req))
            self._resume(req)
            out.scheduled.append(ScheduledRequest(req, n, 0))
            budget -= n
        return out

    def schedule_lookahead(self, reqs: list[Request]) -> list[ScheduledRequest] | None:
        """Async scheduling (runtime.engine.async_steps): the next decode step of `reqs`, running requests
        each with one token still on the device (so they feed position num_computed + 1), planned
        before that token is known. Only where the synchronous schedule() would plan the same thing
        and nothing else: nobody swapped out, nobody waiting who could be admitted, the token budget
        and free blocks enough for all. Allocates their slots; None (changing nothing) otherwise."""
        if self.swapped or (self.waiting and len(self.running) < self.max_num_seqs
                            and self.admission_open(self.clock())):
            return None
        if len(reqs) > self.config.max_num_batched_tokens:
            return None
        kv = self.kv
        growing = [r for r in reqs if kv.blocks_needed(r, 2)]
        if sum(kv.blocks_needed(r, 2) for r in growing) > kv.pool.num_free:
            return None
        for r in growing:
            kv.allocate_slots(r, 2)
        return [ScheduledRequest(r, 1) for r in reqs]

    def _resume(self, req: Request) -> None:
        if req.num_preemptions:
            now = self.clock()
            req.times.resumptions.append(now)
            self.observer.on_request_resumed(req.request_id, now)
        req.status = RequestStatus.RUNNING
        self.running.append(req)

    def _preempt(self, req: Request) -> None:
        if self.kv.can_swap_out(req):
            self.kv.swap_out(req)
            req.status, reason = RequestStatus.SWAPPED, "swap"
            self.swapped.appendleft(req)
        else:
            self.kv.free(req)
            req.num_computed = req.draft_computed = 0
            req.status, reason = RequestStatus.WAITING, "recompute"
            self.waiting.appendleft(req)
        req.num_preemptions += 1
        now = self.clock()
        req.times.preemptions.append((now, reason))
        self.observer.on_request_preempted(req.request_id, now, reason)

    def finish(self, req: Request, reason: str) -> None:
        """Take a request out of whichever queue holds it and free its blocks."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        elif req in self.swapped:
            self.swapped.remove(req)
            self.kv.drop_swapped(req)
        self.kv.free(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
