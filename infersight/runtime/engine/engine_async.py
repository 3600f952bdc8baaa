"""The engine's half of async scheduling (runtime.engine.async_steps): launch a decode step without
reading it, launch the one after it, read a launched step back. A mixin of Engine, kept apart so
that the synchronous step reads at once; besides what Engine.__init__ sets, it calls Engine's
_target_items (the fed tokens), _commit_rows (what a step does with its tokens), fail_request and _end."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from infersight.runtime.engine.async_steps import InflightStep, TokenReadback, continuing
from infersight.runtime.runner.model_runner import FeedItem
from infersight.runtime.engine.sampling import probs_from_logits, sample, sample_batch
from infersight.runtime.engine.scheduler import ScheduledRequest
from infersight.runtime.stats import StepStats

if TYPE_CHECKING:
    from infersight.runtime.config import EngineConfig
    from infersight.runtime.kv.kv_cache import KVCacheManager
    from infersight.runtime.runner.model_runner import ModelRunner
    from infersight.runtime.observer import EngineObserver
    from infersight.runtime.ranges import RangeMarker
    from infersight.runtime.engine.scheduler import Scheduler

log = logging.getLogger("infersight.runtime")


class AsyncSteps:
    config: "EngineConfig"
    observer: "EngineObserver"
    ranges: "RangeMarker"
    kv: "KVCacheManager"
    scheduler: "Scheduler"
    target: "ModelRunner"
    expert_counts: torch.Tensor | None
    readback: TokenReadback | None
    inflight: InflightStep | None
    step_id: int
    steps_launched_ahead: int

    def _launch(self, sched: list[ScheduledRequest], stats: StepStats, prev: InflightStep | None) -> InflightStep:
        """Start a decode step on the device and its tokens' copy back; read nothing.
        prev: the step still in flight whose tokens this one feeds (None: they are on the host)."""
        assert self.readback is not None
        if self.expert_counts is not None:
            self.expert_counts.zero_()
        if prev is None:
            items, src, tokens_in = self._target_items(sched, {}), None, None
        else:
            reqs = [s.req for s in sched]
            items = [FeedItem(r, r.num_computed + 1, [0], 1) for r in reqs]
            src, tokens_in = prev.src_of(reqs), prev.tokens
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
        tokens, failed = self._draw(sched, prev is not None)
        self.readback.send(slot, tokens)
        counts = self.expert_counts.clone() if self.expert_counts is not None else None
        return InflightStep(stats, sched, tokens, slot, timer, counts, failed)

    def _draw(self, sched: list[ScheduledRequest], behind: bool) -> tuple[torch.Tensor, dict[int, Exception]]:
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
            log.exception("step %d: batched sampling failed; sampling request by request", self.step_id)
        drawn, failed = [], {}
        for i, r in enumerate(reqs):
            try:
                drawn.append(sample(probs_from_logits(logits[i:i + 1], r.params)[0], r.generator))
            except Exception as exc:  # noqa: BLE001 -- this request's failure ends this request only
                drawn.append(0)
                failed[i] = exc
        return torch.tensor(drawn, dtype=torch.long, device=logits.device), failed

    def _launch_next(self, pending: InflightStep) -> InflightStep | None:
        """The step after `pending`, launched before pending is read, where that is steady decode."""
        if torch.autograd.profiler._is_profiler_enabled:
            return None
        t0 = time.monotonic_ns()
        reqs = continuing(pending, self.config.max_model_len)
        sched = self.scheduler.schedule_lookahead(reqs) if reqs else None
        if sched is None:
            return None
        stats = StepStats(self.step_id + 1, t0, t0, launched_ahead=True)
        self.step_id += 1
        self.steps_launched_ahead += 1
        return self._launch(sched, stats, pending)

    def _settle(self) -> None:
        """Read back and end the step in flight (its begin was announced) without launching another."""
        pending, self.inflight = self.inflight, None
        assert pending is not None
        self._resolve(pending)
        self._end(pending.stats)

    def _drop(self, step: InflightStep) -> None:
        """Forget a step launched by this step() call whose requests all ended with the step it read
        (its begin was not announced yet, so its id is taken back)."""
        if step.stats.step_id == self.step_id:
            self.step_id -= 1
        if self.inflight is step:
            self.inflight = None

    def _resolve(self, pending: InflightStep) -> None:
        """Read a launched step's tokens and do what the synchronous step does with them."""
        assert self.readback is not None
        stats = pending.stats
        with self.ranges.range("sampling"):
            tokens = self.readback.take(pending.slot, len(pending.sched))
            stats.target_ns = pending.timer.elapsed_ns()
            for row, exc in pending.failed.items():
                self.fail_request(pending.sched[row].req, exc, stats)
            live = [(s, t) for s, t in zip(pending.sched, tokens) if not s.req.is_finished]
            self._commit_rows([s for s, _ in live], None, {s.req.request_id: t for s, t in live}, {}, {}, set(),
                              stats.start_ns, stats.start_ns, stats)
        if pending.expert_counts is not None:
            self.observer.on_expert_counts(stats.step_id, pending.expert_counts)
