"""Sampling parameters and the per-request sampler (temperature, top-k, top-p, per-request seed)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from infersight.runtime.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings, validated on creation (InvalidRequestError on bad values).

    temperature 0 means greedy. top_k <= 0 disables top-k. seed makes the request reproducible
    whatever else is in the batch; with speculation on, a preemption or a tight token budget
    changes how many drafts a step makes, so the tokens stay exactly distributed but can differ. use_speculation turns speculative decoding off for this request
    when the engine has a draft model. task labels the request for per-task statistics."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False
    use_speculation: bool = True
    task: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not self.temperature >= 0:  # also rejects NaN
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int):
            raise InvalidRequestError(f"top_k must be an integer, got {self.top_k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from: logits [N, V] -> probabilities [N, V] (float32).

    Greedy requests get a one-hot on the argmax, so speculative verification treats them uniformly."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        # Keep the smallest set of most likely tokens whose mass reaches top_p (the first always stays).
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p
        sorted_p = sorted_p.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a [V] distribution with the request's own generator."""
    return int(torch.multinomial(probs, 1, generator=generator).item())
