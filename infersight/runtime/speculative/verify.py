"""Exact speculative sampling: the accept/reject rule that keeps the target's distribution, and the
fallback to plain decoding when the draft fails."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Container

import torch

from infersight.runtime.engine.sampling import sample
from infersight.runtime.engine.scheduler import ScheduledRequest

log = logging.getLogger("infersight.runtime")


@dataclass
class Verification:
    """Outcome of verifying gamma draft tokens: tokens to append (accepted drafts + one more)."""

    tokens: list[int]
    num_accepted: int
    accept_mask: list[bool]


def verify(draft_tokens: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
           generator: torch.Generator, greedy: bool) -> Verification:
    """draft_probs [gamma, V] are q_i; target_probs [gamma+1, V] are p_i (the last is for the bonus).

    Rule: accept draft token x_i with probability min(1, p_i(x_i) / q_i(x_i)).
    On the first rejection, sample from normalise(max(0, p_i - q_i)) and stop.
    If all gamma are accepted, sample a bonus token from p_gamma.
    Greedy: accept while x_i == argmax p_i; the replacement and the bonus are argmax p."""
    tokens: list[int] = []
    mask: list[bool] = []
    for i, x in enumerate(draft_tokens):
        p, q = target_probs[i], draft_probs[i]
        if greedy:
            ok = int(p.argmax()) == x
        else:
            u = torch.rand((), generator=generator, device=p.device)
            ok = bool(u * q[x] < p[x])  # u < p/q without dividing by a tiny q
        mask.append(ok)
        if ok:
            tokens.append(x)
            continue
        if greedy:
            tokens.append(int(p.argmax()))
        else:
            residual = torch.clamp(p - q, min=0.0)
            total = residual.sum()
            # p == q exactly leaves no residual mass; then p itself is the right distribution.
            tokens.append(sample(residual / total if total > 0 else p, generator))
        return Verification(tokens, len(tokens) - 1, mask)
    bonus = target_probs[len(draft_tokens)]
    tokens.append(int(bonus.argmax()) if greedy else sample(bonus, generator))
    return Verification(tokens, len(draft_tokens), mask)


class DraftFallbacks:
    """Requests that decode without drafts because the draft model failed for them.

    The draft only proposes; the target decides every token (verify above). So when drafting a
    request raises, the request loses nothing by decoding plainly: its tokens come from the target's
    distribution either way. This is what vLLM does with requests its proposer cannot serve (they get
    no draft tokens while the rest of the batch speculates), rather than failing them:
    - a request whose own draft sampling raised never drafts again (the cause is nearly always its
      parameters or its logits, so it would raise at every step); counted once in `requests`;
    - a draft forward that raised as a whole makes that one step plain for everyone; counted in `steps`.
    A failure of the target's own sampling is still the request's failure (Engine.fail_request).
    Each failure is logged once per request (a broken draft forward: its first time and every 1,000th)."""

    #: Past this many ids, those of requests the engine no longer holds are forgotten.
    PRUNE_AT = 4096

    def __init__(self) -> None:  # noqa: D107
        self.requests = 0
        self.steps = 0
        self.off: set[int] = set()

    def without_drafts(self, sched: list[ScheduledRequest], keep: Callable[[int], bool]) -> list[ScheduledRequest]:
        """`sched`, each speculating request for which keep(request_id) is false made a plain one."""
        return [ScheduledRequest(s.req, s.num_new_tokens) if s.num_spec_tokens and not keep(s.req.request_id) else s
                for s in sched]

    def request_failed(self, request_id: int, exc: Exception, live: Container[int]) -> None:
        """The draft could not sample for `request_id`: it decodes plainly from now on."""
        if request_id in self.off:
            return
        if len(self.off) >= self.PRUNE_AT:
            self.off = {rid for rid in self.off if rid in live}
        self.off.add(request_id)
        self.requests += 1
        log.warning("request %d: draft sampling failed (%s: %s); it decodes without speculation from now on",
                    request_id, type(exc).__name__, exc)

    def step_failed(self, step_id: int, exc: Exception) -> None:
        """The draft forward of step `step_id` raised: that step runs without drafts."""
        self.steps += 1
        if self.steps % 1000 == 1:
            log.error("step %d: the draft model failed (%s: %s); the step runs without speculation "
                      "(%d such steps so far)", step_id, type(exc).__name__, exc, self.steps, exc_info=exc)
