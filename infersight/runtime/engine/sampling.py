"""Sampling parameters and the samplers (temperature, top-k, top-p, per-request seed).

Two samplers. sample_batch draws one token for every row of a [N, V] logits batch at once: the
transforms are vectorised over per-row parameters and the randomness is counter-based (a hash of
the request's seed, its draw index and the vocabulary id), so a request's tokens depend on its
seed alone, not on what else is in the batch, and the batch costs a fixed ~20 kernels and no
host sync. probs_from_logits + sample (a torch.Generator per request) serve speculative decoding,
whose accept/reject rule needs the full distributions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from infersight.runtime.errors import InvalidRequestError

#: Temperatures below this are greedy (vLLM's _SAMPLING_EPS): dividing by them overflows float32.
SAMPLING_EPS = 1e-5


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
        """temperature below SAMPLING_EPS (0 included) samples the argmax."""
        return self.temperature < SAMPLING_EPS


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
        drop = before >= params.top_p
        drop[..., 0] = False  # a top_p that rounds to 0 in float32 still keeps the top token
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a [V] distribution with the request's own generator."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


# -- the batched sampler --------------------------------------------------------------------------
_M32 = 0xFFFFFFFF


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """(h * c) mod 2**32 for h holding uint32 values in int64, in 16-bit halves so that no int64
    product overflows: the result is the same on every device."""
    return (h * (c & 0xFFFF) + (((h * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's finaliser: a bijection on uint32 with full avalanche."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _fmix32_int(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def draw_keys(seed: int, draw: int) -> tuple[int, int]:
    """Two 32-bit keys for a request's draw-th token: every 64 bits of the seed count."""
    lo, hi = seed & _M32, (seed >> 32) & _M32
    k = _fmix32_int(lo ^ _fmix32_int((hi + 0x9E3779B9) & _M32))
    k = _fmix32_int(k ^ ((draw * 0x632BE5AB + 0x7F4A7C15) & _M32))
    return k, _fmix32_int((k + 0x3C6EF372) & _M32)


def gumbel_noise(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise [N, V] (float32) from keys [N, 2] (int64 uint32 values): entry (i, v) is
    a function of row i's keys and v alone. argmax(logits + noise) samples softmax(logits) exactly
    (the Gumbel-max trick), with 24-bit uniforms."""
    vocab = _fmix32(torch.arange(vocab_size, device=keys.device, dtype=torch.long) + 0x165667B1)
    h = _fmix32(_fmix32(keys[:, :1] ^ vocab[None, :]) ^ keys[:, 1:])
    u = ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))  # in (0, 1): both logs stay finite
    return -torch.log(-torch.log(u))


def filtered_logits(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                    top_p: torch.Tensor | None) -> torch.Tensor:
    """logits [N, V] / temperature [N], -inf outside each row's top-k and then top-p set (float32).

    top_k [N]: V for rows without top-k; ties with the k-th value are kept, as in probs_from_logits.
    top_p [N]: > 1 for rows without top-p; the most likely token is always kept. None skips a filter."""
    x = logits.float() / temperature[:, None]
    if top_k is None and top_p is None:
        return x
    neg_inf = float("-inf")
    sorted_x, order = x.sort(dim=-1, descending=True)
    if top_k is not None:
        kth = sorted_x.gather(1, (top_k - 1).clamp(0, x.shape[1] - 1)[:, None])
        x = x.masked_fill(x < kth, neg_inf)
        sorted_x = sorted_x.masked_fill(sorted_x < kth, neg_inf)
    if top_p is not None:
        probs = torch.softmax(sorted_x, dim=-1)
        before = probs.cumsum(-1) - probs
        drop = before >= top_p[:, None]
        drop[:, 0] = False
        x = torch.full_like(x, neg_inf).scatter(1, order, sorted_x.masked_fill(drop, neg_inf))
    return x


def sample_batch(logits: torch.Tensor, params: Sequence[SamplingParams], seeds: Sequence[int],
                 draws: Sequence[int]) -> torch.Tensor:
    """One token per row of logits [N, V], as a [N] int64 tensor on logits' device (no host sync).

    Row i follows params[i]; its randomness is keyed by (seeds[i], draws[i]) only, draws[i] being
    how many tokens the request has drawn before. Greedy rows take the argmax of the raw logits."""
    n, vocab = logits.shape
    greedy = [p.greedy for p in params]
    if all(greedy):
        return logits.argmax(-1)
    device = logits.device
    floats = torch.tensor([[1.0 if g else p.temperature for g, p in zip(greedy, params)],
                           [p.top_p if p.top_p < 1.0 else 2.0 for p in params]], dtype=torch.float32)
    ints = torch.tensor([[p.top_k if 0 < p.top_k < vocab else vocab for p in params], [int(g) for g in greedy]]
                        + [list(k) for k in zip(*(draw_keys(s, d) for s, d in zip(seeds, draws)))],
                        dtype=torch.long)
    floats, ints = floats.to(device, non_blocking=True), ints.to(device, non_blocking=True)
    use_k = any(0 < p.top_k < vocab for g, p in zip(greedy, params) if not g)
    use_p = any(p.top_p < 1.0 for g, p in zip(greedy, params) if not g)
    x = filtered_logits(logits, floats[0], ints[0] if use_k else None, floats[1] if use_p else None)
    tokens = (x + gumbel_noise(ints[2:].t(), vocab)).argmax(-1)
    if any(greedy):
        tokens = torch.where(ints[1].bool(), logits.argmax(-1), tokens)
    return tokens
