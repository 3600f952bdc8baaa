"""Exact speculative sampling: the accept/reject rule that keeps the target's distribution."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from infersight.runtime.sampling import sample


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
