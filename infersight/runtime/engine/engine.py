"""The engine loop: schedule, run the draft (if any), run the target, sample or verify, commit.

The engine is glue: the scheduler owns the queues and the KV cache manager; the runners own the
models. It emits events to one observer and returns a plain StepStats from step(); it never prints.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import replace
from typing import Sequence

import torch

from infersight.runtime.engine.async_steps import AsyncSteps, InflightStep, launchable
from infersight.runtime.checkpoints.hf_tokenizer import tokenizer_for
from infersight.runtime.config import EngineConfig
from infersight.runtime.speculative.draft_proposer import propose
from infersight.runtime.errors import InvalidRequestError
from infersight.runtime.runner.decode_kernel import usable_decode_kernel
from infersight.runtime.runner.forward_timer import ForwardTimer
from infersight.runtime.kv.kv_cache import KVCacheManager
from infersight.runtime.model.transformer import Transformer
from infersight.runtime.runner.model_runner import ModelRunner
from infersight.runtime.observer import EngineObserver
from infersight.runtime.engine.outputs import RequestOutput
from infersight.runtime.engine.request import Request, checked_params
from infersight.runtime.engine.run_policy import RunPolicy
from infersight.runtime.engine.sampling import SamplingParams
from infersight.runtime.engine.scheduler import Scheduler, ScheduledRequest
from infersight.runtime.engine.step_rows import advance, draw_plain_tokens, forward_name, target_items, tell_emitted
from infersight.runtime.speculative.spec_probe import SpecProbe
from infersight.runtime.speculative.verify import DraftFallbacks
from infersight.runtime.stats import StepStats
from infersight.runtime.model.weights import build_model

log = logging.getLogger("infersight.runtime")


class Engine:
    def __init__(self, config: EngineConfig, observer: EngineObserver | None = None) -> None:
        self.config = config
        self.observer = observer if observer is not None else EngineObserver()
        self.tokenizer = tokenizer_for(config.model_config)  # a checkpoint's own, else bytes
        self.ranges = self.observer.ranges
        self.kv = KVCacheManager(config, self.observer)
        self.scheduler = Scheduler(config, self.kv, self.observer)
        backend = config.resolved_attention_backend
        self.decode_attention = usable_decode_kernel(config.resolved_decode_attention, config.decode_attention,
                                                     config.device)
        cfg = config.model_config
        target = self.build_target(config, backend, self.decode_attention)
        self.target = ModelRunner(target, *self.kv.device_kv[0], config.block_size, config.device,
                                  config.packed_prefill)
        self.target.use_cuda_graphs(config, self.decode_attention)  # decode steps as CUDA graphs, when they can be
        self.draft: ModelRunner | None = None
        if config.draft_config is not None:
            draft = build_model(config.draft_config, dtype=config.torch_dtype, device=config.device,
                                seed=config.seed, weights=config.speculative_weights,
                                attention_backend=backend, ranges=self.ranges,
                                decode_attention=self.decode_attention)
            self.draft = ModelRunner(draft, *self.kv.device_kv[1], config.block_size, config.device,
                                     config.packed_prefill)
        self.spec_probe = SpecProbe(config.spec_probe_every if self.draft is not None else 0, config.spec_probe_run)
        self.draft_fallbacks = DraftFallbacks()  # requests (and steps) the draft failed: decoded plainly
        self.forward_timer = ForwardTimer(config.device)
        self.expert_counts = None
        if self.observer.wants_expert_counts and cfg.is_moe:
            self.expert_counts = torch.zeros(cfg.n_layers, cfg.n_experts, dtype=torch.long, device=config.device)
        # Async scheduling (runtime.engine.async_steps): its launcher, and the step launched and not read back yet.
        self.async_steps = (AsyncSteps(self.target, self.scheduler, self.ranges, self.expert_counts,
                                       config.max_model_len, config.max_num_seqs, config.device)
                            if config.async_scheduling else None)
        self.inflight: InflightStep | None = None
        self.requests: dict[int, Request] = {}
        self.observer.on_model(cfg, config.torch_dtype.itemsize)
        # The run-time policy (runtime.engine.run_policy): none until an agent sets one; each request's
        # canary arm is drawn from its own stream, so arms do not move the requests' seeds.
        self.policy = RunPolicy()
        self._arm_draws = random.Random(config.seed)
        self.observer.on_policy_limits(config.max_num_seqs)
        self.next_request_id = 0
        self._trace_ids = random.Random()  # W3C trace ids for requests that arrive without one
        self.step_id = 0

    @property
    def steps_launched_ahead(self) -> int:
        """Steps async scheduling launched before the step before them was read (0 without it)."""
        return self.async_steps.launched_ahead if self.async_steps is not None else 0

    def build_target(self, config: EngineConfig, attention_backend: str, decode_attention: str) -> Transformer:
        """The target model, in eval mode on config.device. An expert-parallel engine overrides this to
        build only its rank's experts (runtime/parallel/local_model.py)."""
        return build_model(config.model_config, dtype=config.torch_dtype, device=config.device, seed=config.seed,
                           weights=config.weights, attention_backend=attention_backend, ranges=self.ranges,
                           decode_attention=decode_attention)

    # -- requests -------------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None, *,
                    task: str | None = None, trace_id: int = 0) -> int:
        """Queue a request; returns its id. Bad input raises InvalidRequestError and changes nothing.

        trace_id: the caller's 128-bit W3C trace id (from its traceparent); 0 generates one."""
        params = params if params is not None else SamplingParams()
        params = checked_params(params, self.config.max_model_len)  # InvalidParamError names the field
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt is empty")
            token_ids = self.tokenizer.encode(prompt)
        else:
            token_ids = list(prompt)
            if not token_ids:
                raise InvalidRequestError("prompt is empty")
            vocab = self.config.model_config.vocab_size
            if not all(isinstance(t, int) and 0 <= t < vocab for t in token_ids):
                raise InvalidRequestError(f"prompt token ids must be integers in [0, {vocab})")
        max_len = self.config.max_model_len
        if len(token_ids) >= max_len:
            raise InvalidRequestError(f"prompt has {len(token_ids)} tokens; the maximum length is {max_len} "
                                      f"(max_model_len) including at least one generated token")
        rid = self.next_request_id
        self.next_request_id += 1
        seed = params.seed if params.seed is not None else self.config.seed * 1_000_003 + rid
        gen = torch.Generator(device=self.config.device).manual_seed(seed)
        trace_id = trace_id or self._trace_ids.getrandbits(128) or 1
        now = time.monotonic_ns()
        task = task or params.task
        self._take_policy()  # a request draws its arm from the newest policy written before it arrived
        speculate, arm = self.policy.arm(task, self._arm_draws.random())
        if speculate is False and params.use_speculation:
            params = replace(params, use_speculation=False)
        req = Request(rid, token_ids, params, gen, now, trace_id=trace_id, task=task)
        self.requests[rid] = req
        self.scheduler.add(req)
        self.observer.on_request_arrived(rid, now, len(token_ids), req.task, trace_id)
        if self.policy.seq:
            self.observer.on_policy_arm(rid, now, int(arm), self.policy.seq)
        return rid

    def abort_request(self, request_id: int) -> None:
        req = self.requests.get(request_id)
        if req is not None and not req.is_finished:
            self._finish(req, "abort")
            if self.inflight is not None and self.inflight.all_finished():
                self._settle()  # nobody is left to step it: end it now, not at some later step()

    def fail_request(self, req: Request, exc: Exception, stats: StepStats | None = None) -> None:
        """Finish a request whose own sampling, commit or probes raised: reason "error", req.error set
        (a caller reads it from there); the rest of the batch goes on. A request that had already
        finished keeps its result (what raised came after it)."""
        log.error("request %d failed in step %d: %s: %s", req.request_id, self.step_id, type(exc).__name__, exc,
                  exc_info=exc)
        if req.is_finished:
            return
        req.error = exc
        try:
            self._finish(req, "error")
        except Exception:  # noqa: BLE001 -- the scheduler has let it go; only its FINISHED record is lost
            log.exception("request %d: finishing it after its failure raised too", req.request_id)
        if stats is not None:
            stats.finished.append(req.request_id)

    def capture_decode_graphs(self) -> int:
        """Capture every CUDA graph pure decode steps may replay, before serving (a lazy capture
        costs the step that needs it); returns how many. Nothing without graphs (the CPU, eager)."""
        return self.target.capture_decode_graphs(self.expert_counts)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def get_output(self, request_id: int) -> RequestOutput:
        req = self.requests[request_id]
        return RequestOutput.from_request(req, self.tokenizer.decode(req.output_token_ids))

    def release(self, request_id: int) -> RequestOutput:
        """The output of a finished request, forgetting the request."""
        out = self.get_output(request_id)
        del self.requests[request_id]
        return out

    # -- the step -------------------------------------------------------------------------------
    def step(self) -> StepStats:
        """Schedule and run one iteration; returns what happened (never prints). With async
        scheduling, the step returned may be one launched by the call before, and the next one may
        already be running on the device (runtime.engine.async_steps)."""
        self._take_policy()
        pending = self.inflight
        if pending is None:
            self.step_id += 1
            start = time.monotonic_ns()
            stats = StepStats(self.step_id, start, start)
            self._begin(stats)
            with self.ranges.range("step"):
                with self.ranges.range("schedule"):
                    plan = self.scheduler.schedule()
                stats.num_preempted = len(plan.preempted)
                stats.kv_moves = len(plan.preempted) + plan.swapped_in
                if plan.scheduled:
                    sched, prefilling = self._probe(plan.scheduled, stats)
                    if self.async_steps is not None and launchable(sched):
                        pending = self.async_steps.launch(sched, stats, target_items(sched, {}))
                    else:
                        self._run(sched, prefilling, start, stats)
            if pending is None:
                return self._end(stats)
        with self.ranges.range("step"):
            self.inflight = self._launch_next(pending)
            pending.stats.launched_next = self.inflight is not None
            self._resolve(pending)
        stats = self._end(pending.stats)
        if self.inflight is not None:
            if self.inflight.all_finished():  # every request of it ended with the step just read
                self._drop(self.inflight)
            else:
                self.inflight.stats.start_ns = stats.end_ns
                self._begin(self.inflight.stats)
        return stats

    # -- async scheduling: the engine's half (what it does with a launched step) --------------------
    def _launch_next(self, pending: InflightStep) -> InflightStep | None:
        """The step after `pending`, launched before pending is read, where that is steady decode. With a
        draft, only within a plain probe run (runtime.speculative.spec_probe): a speculative step needs
        the tokens of the step before on the host, to draft from."""
        assert self.async_steps is not None
        if self.draft is not None and not (pending.stats.spec_probe and self.spec_probe.continues_run()):
            return None
        step = self.async_steps.launch_next(pending, self.step_id + 1)
        if step is None:
            self.spec_probe.end_run()  # no-op without a run
            return None
        if self.draft is not None:
            step.stats.spec_probe = True
            self.spec_probe.launched_in_run(len(step.sched))
        self.step_id += 1
        return step

    def _resolve(self, pending: InflightStep) -> None:
        """Read a launched step's tokens and do what the synchronous step does with them."""
        assert self.async_steps is not None
        stats = pending.stats
        with self.ranges.range("sampling"):
            tokens = self.async_steps.read(pending)
            for row, exc in pending.failed.items():
                self.fail_request(pending.sched[row].req, exc, stats)
            live = [(s, t) for s, t in zip(pending.sched, tokens) if not s.req.is_finished]
            self._commit_rows([s for s, _ in live], None, {s.req.request_id: t for s, t in live}, {}, {}, set(),
                              stats.start_ns, stats.start_ns, stats)
        if pending.expert_counts is not None:
            self.observer.on_expert_counts(stats.step_id, pending.expert_counts)

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

    def _take_policy(self) -> None:
        policy = self.observer.policy_update()
        if policy is not None:
            self.apply_policy(policy)

    def apply_policy(self, policy: RunPolicy) -> None:
        """Take a run-time policy: requests arriving from now on draw their arm from it (those in flight
        keep theirs); the scheduler admits up to its max_num_seqs (within the configured limit, which
        sized the buffers: those running beyond a lowered limit finish, none is preempted for it)."""
        self.policy = policy
        self.scheduler.max_num_seqs = policy.seq_limit(self.config.max_num_seqs)
        log.info("run-time policy %d: max_num_seqs %d, tasks %s", policy.seq, self.scheduler.max_num_seqs,
                 {t.label: (t.speculate, t.old_speculate, t.control_share) for t in policy.tasks})

    def _begin(self, stats: StepStats) -> None:
        self.ranges.begin_step(stats.step_id)
        self.observer.on_step_begin(stats.step_id, stats.start_ns)

    def _end(self, stats: StepStats) -> StepStats:
        stats.end_ns = time.monotonic_ns()
        stats.kv_blocks_in_use = self.kv.pool.num_in_use
        stats.kv_blocks_cached = len(self.kv.pool.free_cached)
        stats.kv_blocks_total = self.kv.pool.num_blocks
        stats.kv_block_size = self.config.block_size
        stats.num_waiting = len(self.scheduler.waiting)
        stats.num_running = len(self.scheduler.running)
        stats.num_swapped = len(self.scheduler.swapped)
        self.observer.on_step_end(stats)
        return stats

    def _probe(self, sched: list[ScheduledRequest], stats: StepStats) -> tuple[list[ScheduledRequest], set[int]]:
        """The step's schedule, without its drafts where SpecProbe makes it a plain probe step, and the
        ids of its requests in prefill."""
        prefilling = {s.req.request_id for s in sched if s.req.in_prefill or not s.req.output_token_ids}
        if self.spec_probe.runs_plain(sched, prefilling):
            # A plain decode step, as an engine without a draft would run it: no drafting at all
            # (the draft's KV catches up at the next speculative step).
            stats.spec_probe = True
            sched = [ScheduledRequest(s.req, s.num_new_tokens) for s in sched]
        return sched, prefilling

    def _run(self, sched: list[ScheduledRequest], prefilling: set[int], start: int, stats: StepStats) -> None:
        if self.expert_counts is not None:
            self.expert_counts.zero_()
        t_draft = time.monotonic_ns()
        stats.schedule_ns = t_draft - start
        drafts: dict[int, list[int]] = {}
        draft_probs: dict[int, torch.Tensor] = {}
        if self.draft is not None and not stats.spec_probe:
            sched = self.draft_fallbacks.without_drafts(sched, lambda rid: rid not in self.draft_fallbacks.off)
            with self.ranges.range("forward.draft"):
                try:
                    drafts, draft_probs = propose(self.draft, sched, self.draft_fallbacks, self.requests)
                except Exception as exc:  # noqa: BLE001 -- the draft only proposes: the step goes on without it
                    self.draft_fallbacks.step_failed(self.step_id, exc)
            sched = self.draft_fallbacks.without_drafts(sched, drafts.__contains__)
            stats.draft_forwards = max((s.num_spec_tokens for s in sched), default=0)
            stats.draft_ns = time.monotonic_ns() - t_draft
        forward = forward_name(sched, prefilling)
        stats.phase = forward.removeprefix("forward.")
        captures = self.target.num_captures
        with self.ranges.range(forward):
            self.forward_timer.start()
            logits = self.target.run(target_items(sched, drafts), self.expert_counts,
                                     self.observer.decode_graphs_while_profiling)
            self.forward_timer.stop()
        stats.graph_captures = self.target.num_captures - captures
        stats.profiled = torch.autograd.profiler._is_profiler_enabled
        end_forward = time.monotonic_ns()
        with self.ranges.range("sampling"):
            sampled = self._sample_plain(sched, logits, drafts)
            self._commit_rows(sched, logits, sampled, drafts, draft_probs, prefilling, start, end_forward, stats)
        if stats.target_ns < 0:
            stats.target_ns = self.forward_timer.elapsed_ns()
        if self.expert_counts is not None:
            self.observer.on_expert_counts(self.step_id, self.expert_counts)

    def _commit_rows(self, sched: list[ScheduledRequest], logits: Sequence[torch.Tensor] | None,
                     sampled: dict[int, int], drafts: dict[int, list[int]], draft_probs: dict[int, torch.Tensor],
                     prefilling: set[int], start: int, end_forward: int, stats: StepStats) -> None:
        """Each scheduled request's share of the step: counters moved, tokens sampled or verified,
        KV committed, tokens emitted; a request that fails here ends alone (fail_request).
        logits: None only when every request's token is in `sampled` (an async step)."""
        emitted: list[tuple[Request, int]] = []  # tokens told to the observer at once, after the loop
        for i, s in enumerate(sched):
            req = s.req
            token = sampled.get(req.request_id)
            # A row view only where it is read (ModelRunner.LogitsRows): not for a sampled token.
            lg = logits[i] if logits is not None and (token is None or s.num_spec_tokens) else None
            stats.batch.append((req.request_id, s.num_new_tokens + s.num_spec_tokens))
            stats.context_lens.append(req.num_computed + s.num_new_tokens + s.num_spec_tokens)
            if req.request_id in prefilling:
                stats.num_prefill_tokens += s.num_new_tokens
                req.times.prefill_chunks.append((start, end_forward, s.num_new_tokens))
                self.observer.on_prefill_chunk(req.request_id, start, end_forward, req.num_computed,
                                               s.num_new_tokens)
            else:
                stats.num_decode_tokens += s.num_new_tokens
            try:
                new_tokens = advance(s, lg, drafts.get(req.request_id), draft_probs.get(req.request_id), stats,
                                     self.observer, self.forward_timer, token)
                self.kv.commit(req)
                if new_tokens:
                    self._emit(req, new_tokens, stats, emitted)
            except Exception as exc:  # noqa: BLE001 -- one request's failure ends that request only
                self.fail_request(req, exc, stats)
        if emitted:
            tell_emitted(self.observer, emitted, lambda req, exc: self.fail_request(req, exc, stats))

    def _sample_plain(self, sched: list[ScheduledRequest], logits: Sequence[torch.Tensor],
                      drafts: dict[int, list[int]]) -> dict[int, int]:
        """step_rows.draw_plain_tokens; should the draw raise, {} sends each request down its own
        sampling path (_advance), where a failure ends that request only."""
        try:
            return draw_plain_tokens(self.target, sched, logits, drafts)
        except Exception:  # noqa: BLE001 -- see the docstring
            log.exception("step %d: batched sampling failed; sampling request by request", self.step_id)
            return {}

    def _emit(self, req: Request, tokens: list[int], stats: StepStats, held: list[tuple[Request, int]]) -> None:
        """Append the request's new tokens, finish it if they end it; the observer hears of them now
        when they end it (TOKENS must precede FINISHED), else with the step's others (`held`)."""
        if not req.output_token_ids:
            req.times.first_token_ns = now = time.monotonic_ns()
            self.observer.on_first_token(req.request_id, now)
        reason = None
        emitted = 0
        for t in tokens:
            req.output_token_ids.append(t)
            emitted += 1
            if t in self.tokenizer.eos_ids and not req.params.ignore_eos:
                reason = "stop"
            elif (len(req.output_token_ids) >= req.params.max_tokens
                  or req.num_tokens >= self.config.max_model_len):
                reason = "length"
            if reason:
                break
        if not reason:
            held.append((req, emitted))
            return
        self.observer.on_tokens_emitted(req.request_id, time.monotonic_ns(), emitted)
        self._finish(req, reason)
        stats.finished.append(req.request_id)

    def _finish(self, req: Request, reason: str) -> None:
        self.scheduler.finish(req, reason)
        req.times.finish_ns = now = time.monotonic_ns()
        self.observer.on_request_finished(req.request_id, now, reason, len(req.output_token_ids))
