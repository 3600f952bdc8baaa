"""A request's state inside the engine: its tokens, how many have KV, and its monotonic timestamps;
and the checks its sampling parameters pass before the engine accepts it (checked_params)."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from infersight.runtime.errors import InvalidRequestError
from infersight.runtime.engine.sampling import SamplingParams

#: Below this temperature sampling is greedy (vLLM's _SAMPLING_EPS): dividing logits by 1e-40
#: overflows float32 to inf, and the softmax of inf is NaN.
SAMPLING_EPS = 1e-5
MAX_TEMPERATURE = 2.0  # vLLM's and OpenAI's upper bound
#: The smallest normal float32: a smaller top_p rounds to 0 on the device and masks every token.
#: Any top_p at or below 1/vocab keeps only the most likely token, so raising it changes nothing.
TOP_P_FLOOR = 1.1754943508222875e-38
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class InvalidParamError(InvalidRequestError):
    """A sampling parameter out of range; `param` names it (the HTTP door puts it in the 400)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParamError(name, f"{name} must be a number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:  # an integer beyond float range
        value = math.inf
    if not math.isfinite(value):
        raise InvalidParamError(name, f"{name} must be a finite number, got {value}.")
    return value


def _integer(name: str, value: Any, low: int, high: float, message: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParamError(name, f"{name} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidParamError(name, message.format(value=value))
    return value


def checked_sampling_fields(temperature: Any, top_p: Any, top_k: Any, max_tokens: Any, seed: Any,
                            max_model_len: int) -> dict[str, Any]:
    """The fields, range-checked as vLLM checks them (messages included), and normalized for the
    sampler: temperature below SAMPLING_EPS is 0 (greedy), top_p at least TOP_P_FLOOR, seed -1 is
    None. max_tokens above max_model_len is refused (vLLM: 400), not capped. Raises
    InvalidParamError naming the field."""
    t = _real("temperature", temperature)
    if t < 0:
        raise InvalidParamError("temperature", f"temperature must be non-negative, got {t}.")
    if t > MAX_TEMPERATURE:
        raise InvalidParamError("temperature", f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {t}.")
    p = _real("top_p", top_p)
    if not 0 < p <= 1:
        raise InvalidParamError("top_p", f"top_p must be in (0, 1], got {p}.")
    k = _integer("top_k", top_k, -1, math.inf, "top_k must be 0 (disable), or at least 1, got {value}.")
    if k > INT32_MAX:  # no vocabulary is wider: int32 keeps every consumer exact
        raise InvalidParamError("top_k", f"top_k must be at most {INT32_MAX}, got {k}.")
    n = _integer("max_tokens", max_tokens, 1, math.inf, "max_tokens must be at least 1, got {value}.")
    if n > max_model_len:
        raise InvalidParamError("max_tokens", f"max_tokens={n} cannot be greater than max_model_len="
                                f"{max_model_len}. Please request fewer output tokens.")
    if seed is not None:
        seed = _integer("seed", seed, INT64_MIN, INT64_MAX,
                        f"seed must be in [{INT64_MIN}, {INT64_MAX}], got {{value}}.")
    return {"temperature": 0.0 if t < SAMPLING_EPS else t, "top_p": max(p, TOP_P_FLOOR), "top_k": k,
            "max_tokens": n, "seed": None if seed == -1 else seed}


def checked_params(params: SamplingParams, max_model_len: int) -> SamplingParams:
    """`params` as the engine may run them (see checked_sampling_fields); InvalidParamError if not.
    The task label must be text that encodes (no lone surrogates): the probes write it as UTF-8."""
    fields = checked_sampling_fields(params.temperature, params.top_p, params.top_k, params.max_tokens,
                                     params.seed, max_model_len)
    if params.task is not None:
        if not isinstance(params.task, str):
            raise InvalidParamError("task", f"task must be a string, got {type(params.task).__name__}")
        try:
            params.task.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidParamError("task", f"task is not valid Unicode text (lone surrogate at {exc.start})") from None
    changed = {k: v for k, v in fields.items() if getattr(params, k) != v or type(getattr(params, k)) is not type(v)}
    return replace(params, **changed) if changed else params


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"      # preempted with its KV in the CPU tier
    FINISHED = "finished"


@dataclass
class RequestTimes:
    """Monotonic-ns timestamps (time.monotonic_ns, one process); the sidecar turns them into intervals."""

    arrival_ns: int
    first_scheduled_ns: int | None = None
    prefill_chunks: list[tuple[int, int, int]] = field(default_factory=list)  # (start_ns, end_ns, tokens)
    first_token_ns: int | None = None
    preemptions: list[tuple[int, str]] = field(default_factory=list)  # (ns, "recompute" | "swap")
    resumptions: list[int] = field(default_factory=list)
    finish_ns: int | None = None


@dataclass
class Request:
    """Token layout: token_ids = prompt + output. KV exists for positions [0, num_computed).

    The last token never has KV until the next step feeds it, so a decoding request has
    num_computed == len(token_ids) - 1. draft_computed is the same count for the draft model."""

    request_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    arrival_ns: int
    trace_id: int = 0
    task: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    block_table: list[int] = field(default_factory=list)  # grows in place only; any other change: a new list
    num_cached_blocks: int = 0          # leading blocks already registered in the prefix cache
    last_cached_hash: int = 0           # the chained hash of block num_cached_blocks - 1 (0: none)
    num_computed: int = 0
    draft_computed: int = 0
    num_prefix_hit_tokens: int = 0
    num_preemptions: int = 0
    num_spec_proposed: int = 0
    num_spec_accepted: int = 0
    finish_reason: str | None = None
    error: Exception | None = None  # why the engine finished it with reason "error" (its own failure)
    times: RequestTimes = field(init=False)

    def __post_init__(self) -> None:
        self.times = RequestTimes(arrival_ns=self.arrival_ns)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids) - self.num_computed

    @property
    def in_prefill(self) -> bool:
        # num_uncomputed > 1, written out: read for every request several times a step
        return len(self.prompt_token_ids) + len(self.output_token_ids) - self.num_computed > 1

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
