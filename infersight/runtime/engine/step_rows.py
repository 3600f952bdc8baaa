"""The rows of one engine step: what each scheduled request feeds the target, the forward's name,
the batched draw of the plain rows' next tokens, and each row's advance (tokens sampled, or drafts
verified). The engine (runtime.engine.engine) calls these in order; they touch only the requests
and the objects passed in."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from infersight.runtime.engine.sampling import probs_from_logits, sample, sample_batch
from infersight.runtime.engine.scheduler import ScheduledRequest
from infersight.runtime.runner.model_runner import FeedItem
from infersight.runtime.speculative.verify import verify
from infersight.runtime.stats import StepStats

if TYPE_CHECKING:
    from infersight.runtime.engine.request import Request
    from infersight.runtime.observer import EngineObserver
    from infersight.runtime.runner.forward_timer import ForwardTimer
    from infersight.runtime.runner.model_runner import ModelRunner


def forward_name(sched: list[ScheduledRequest], prefilling: set[int]) -> str:
    """forward.verify when drafts are checked, else prefill, decode or mixed by batch content."""
    if any(s.num_spec_tokens for s in sched):
        return "forward.verify"
    n_prefill = sum(1 for s in sched if s.req.request_id in prefilling)
    if n_prefill == len(sched):
        return "forward.prefill"
    return "forward.mixed" if n_prefill else "forward.decode"


def target_items(sched: list[ScheduledRequest], drafts: dict[int, list[int]]) -> list[FeedItem]:
    """Each row's tokens for the target: its uncomputed tokens, plus its drafts when it verifies."""
    items = []
    for s in sched:
        req = s.req
        if s.num_new_tokens == 1 and req.output_token_ids and req.num_computed == req.num_tokens - 1:
            toks = req.output_token_ids[-1:]  # a decode: no copy of the whole prompt + output
        else:
            toks = req.token_ids[req.num_computed:req.num_computed + s.num_new_tokens]
        if s.num_spec_tokens:
            items.append(FeedItem(req, req.num_computed, toks + drafts[req.request_id], s.num_spec_tokens + 1))
        else:
            items.append(FeedItem(req, req.num_computed, toks, 1 if s.samples else 0))
    return items


def draw_plain_tokens(target: "ModelRunner", sched: list[ScheduledRequest], logits: Sequence[torch.Tensor],
                      drafts: dict[int, list[int]]) -> dict[int, int]:
    """The next token of every request that samples without verifying drafts: one batched draw
    (runtime.engine.sampling.sample_batch) and one host sync for the whole step. May raise (the
    engine then samples request by request)."""
    rows = [(s.req, i) for i, s in enumerate(sched)
            if s.samples and not (s.num_spec_tokens and s.req.request_id in drafts)]
    if not rows:
        return {}
    reqs = [r for r, _ in rows]
    # A greedy graph step's tokens are already on the host (ModelRunner.greedy_tokens).
    tokens = (target.greedy_tokens(len(rows))
              if len(rows) == len(sched) and all(r.params.greedy for r in reqs) else None)
    if tokens is None:
        full = target.last_logits
        batch = (full if full is not None and len(rows) == len(sched) == full.shape[0]
                 else torch.stack([logits[i][-1] for _, i in rows]))
        tokens = sample_batch(batch, [r.params for r in reqs], [r.generator.initial_seed() for r in reqs],
                              [len(r.output_token_ids) for r in reqs]).tolist()
    return {r.request_id: t for r, t in zip(reqs, tokens)}


def advance(s: ScheduledRequest, logits: torch.Tensor | None, drafted: list[int] | None, q: torch.Tensor | None,
            stats: StepStats, observer: "EngineObserver", forward_timer: "ForwardTimer",
            sampled: int | None = None) -> list[int]:
    """Move the request's computed counters forward and return the tokens it gained (logits: the
    request's rows, None only when `sampled` is its token and it verifies no drafts)."""
    req = s.req
    if s.num_spec_tokens and drafted is not None and q is not None:
        assert logits is not None
        p = probs_from_logits(logits, req.params)
        result = verify(drafted, q, p, req.generator, req.params.greedy)
        if stats.target_ns < 0:  # verify() has read the logits: the forward is over (see ForwardTimer)
            stats.target_ns = forward_timer.elapsed_ns()
        base = req.num_computed
        # Target KV is valid for the fed token and the accepted drafts; the draft was fed one
        # position fewer (its last proposal was never fed back). The rest is rolled back.
        req.num_computed = base + 1 + result.num_accepted
        req.draft_computed = min(base + s.num_spec_tokens, req.num_computed)
        req.num_spec_proposed += s.num_spec_tokens
        req.num_spec_accepted += result.num_accepted
        stats.num_spec_tokens += s.num_spec_tokens
        stats.num_spec_accepted += result.num_accepted
        observer.on_spec_verified(req.request_id, s.num_spec_tokens, result.num_accepted,
                                  result.accept_mask, stats.draft_ns, stats.target_ns)
        return result.tokens
    # draft_computed is left alone: propose() moved it when the draft ran, and after a plain
    # probe step the draft is one token behind, which the next propose() feeds.
    req.num_computed += s.num_new_tokens
    if not s.samples:
        return []
    if sampled is not None:
        return [sampled]
    assert logits is not None
    return [sample(probs_from_logits(logits[-1:], req.params)[0], req.generator)]


def tell_emitted(observer: EngineObserver, emitted: list[tuple[Request, int]],
                 fail: Callable[[Request, Exception], None]) -> None:
    """A step's held emissions (request, tokens) in one observer call; should it raise, each alone,
    and a request whose call raises is handed to `fail` (as a probe failure inside the engine's emit
    fails it)."""
    now = time.monotonic_ns()
    try:
        observer.on_tokens_emitted_many([r.request_id for r, _ in emitted], now, [n for _, n in emitted])
    except Exception:  # noqa: BLE001 -- the observer recorded none of them: offered one by one below
        for req, n in emitted:
            try:
                observer.on_tokens_emitted(req.request_id, now, n)
            except Exception as exc:  # noqa: BLE001 -- this request's failure ends this request only
                fail(req, exc)
