"""vLLM's v1 stats objects -> infersight probe records: pure functions, no vLLM, no torch.

The stat logger (``stat_logger.py``) hands each ``record()`` call's ``SchedulerStats`` and
``IterationStats`` here and writes what comes back. Inputs are read by attribute only (the
Protocols below mirror ``vllm/v1/metrics/stats.py`` of vLLM 0.32), so tests build them by hand.
A record is ``(RecordKind, field values in the layout order of probes/records.py)``.

Clocks. vLLM stamps ``IterationStats.iteration_timestamp`` and each request's arrival with
``time.time()`` in the API-server process; engine-core instants are ``time.monotonic()`` in the
engine-core process, and ``FinishedRequestStats`` carries only intervals between them. Our records
are on ``time.monotonic_ns()`` of the API-server process: a wall time is mapped through a
(wall, monotonic) pair read in the same ``record()`` call (``Clock``), so the only error is a
wall-clock step between the two readings.

A finished request's lifecycle, rebuilt. vLLM gives e2e = F - A (frontend clock), queued = S - Q,
prefill = T - S and decode = L - T (engine-core clock: Q queued in the engine core, S first
scheduled, T first token, L last token), where F is the timestamp of the iteration that finished
it. Anchored at F and taking L = F::

    A = F - e2e          T = F - decode          S = T - prefill

e2e, prefill and decode keep their exact lengths. Every engine-side instant comes out late by
delta = F - L, the time the last step's output took to reach the frontend (IPC and output
processing, well under a millisecond on one host). The queue part (S - A) absorbs that delta.
TTFT (T - A) differs from vLLM's own by delta_last - delta_first. Q is not written: our queue runs
from arrival to first scheduling, and it includes the frontend -> engine-core hand-off.

Not in vLLM's stats, so approximated (and said so):
- when preemptions happened: vLLM counts them, and its prefill and decode intervals include the
  stalls. Each one is written as PREEMPTED then RESUMED at S. The count agrees, and no stall time
  is invented (preemption_stall_s stays 0; the stall is inside prefill/decode as in vLLM).
- prefill chunks: one PREFILL_CHUNK covers [S, T).
- token times: one TOKENS of 1 token at T, one of the rest at F. Inter-token latency is then the
  request's mean (vLLM's mean_time_per_output_token).
- a request without output tokens (aborted while waiting, say) has no S or T: ARRIVED and
  FINISHED only.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol, Sequence

from infersight.probes.records import FinishReason, PreemptReason, RecordKind, RequestEvent

Record = tuple[RecordKind, tuple]

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}
MASK_BITS = 64  # SPEC.accept_mask holds 64 draft positions
#: A clock pair read within this bracket is taken at once (two monotonic reads take ~0.1 us on a free core).
TIGHT_NS = 20_000


# -- what is read from vLLM's stats (attribute names as in vllm/v1/metrics/stats.py) -------------
class PrefixCacheStatsLike(Protocol):
    queries: int
    hits: int


class SpecDecodingStatsLike(Protocol):
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_accepted_tokens_per_pos: Sequence[int]
    num_draft_tokens_per_pos: Sequence[int]


class IterationDetailsLike(Protocol):
    num_ctx_tokens: int
    num_generation_tokens: int
    elapsed_ms: float


class SchedulerStatsLike(Protocol):
    num_running_reqs: int
    num_waiting_reqs: int
    num_skipped_waiting_reqs: int
    kv_cache_usage: float
    spec_decoding_stats: SpecDecodingStatsLike | None
    iteration_details: IterationDetailsLike | None


class PromptTokenStatsLike(Protocol):
    computed: int


class FinishedRequestStatsLike(Protocol):
    finish_reason: object  # vllm.v1.engine.FinishReason; str() gives "stop", "length", "abort", ...
    request_id: str | None
    e2e_latency: float
    num_prompt_tokens: int
    num_preemptions: int
    num_generation_tokens: int
    queued_time: float
    prefill_time: float
    decode_time: float
    num_cached_tokens: int


class IterationStatsLike(Protocol):
    iteration_timestamp: float
    num_preempted_reqs: int
    prompt_token_stats: PromptTokenStatsLike
    inter_token_latencies_iter: Sequence[float]
    finished_requests: Sequence[FinishedRequestStatsLike]


# -- small value types ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Clock:
    """A (time.time_ns(), time.monotonic_ns()) pair read together: maps vLLM's wall seconds to our ns."""

    wall_ns: int
    mono_ns: int

    @classmethod
    def now(cls, wall: Callable[[], int] = time.time_ns, mono: Callable[[], int] = time.monotonic_ns,
            tries: int = 3) -> "Clock":
        """The wall read between two monotonic reads, the tightest bracket of `tries` kept (its midpoint):
        a thread switch between two bare reads would shift every instant mapped with the pair by the
        switch's length, and a last byte stamped 2.3 ms before its request's finish was seen in tests."""
        best = (-1, 0, 0)
        for _ in range(tries):
            m0, w, m1 = mono(), wall(), mono()
            if best[0] < 0 or m1 - m0 < best[0]:
                best = (m1 - m0, w, (m0 + m1) // 2)
            if best[0] <= TIGHT_NS:
                break
        return cls(best[1], best[2])

    def mono(self, wall_s: float) -> int:
        return self.mono_ns + round(wall_s * 1e9) - self.wall_ns


class RequestContext(NamedTuple):
    """What the middleware learnt about a request: the caller's trace id (split) and its task id."""

    trace_hi: int = 0
    trace_lo: int = 0
    task_id: int = 0


@dataclass(frozen=True)
class KvGeometry:
    """total_blocks: usable KV blocks (vLLM's num_gpu_blocks less its null block); block_size in tokens."""

    total_blocks: int
    block_size: int


def _ns(seconds: float) -> int | None:
    """An interval in ns, or None when vLLM left it unset or meaningless (negative, NaN)."""
    return round(seconds * 1e9) if math.isfinite(seconds) and seconds >= 0 else None


# -- steps ---------------------------------------------------------------------------------------
def step_window(end_ns: int, previous_end_ns: int | None, sched: SchedulerStatsLike | None) -> tuple[int, int]:
    """(start, end) of a step that ended at end_ns. With vLLM's iteration details (opt-in flag
    --enable-logging-iteration-details) the engine core's own elapsed time; otherwise it started
    when the previous step ended (previous_end_ns: None when the engine was idle in between, then
    the step has zero length rather than swallowing the idle time)."""
    details = sched.iteration_details if sched is not None else None
    if details is not None and math.isfinite(details.elapsed_ms) and details.elapsed_ms >= 0:
        return end_ns - round(details.elapsed_ms * 1e6), end_ns
    start = previous_end_ns if previous_end_ns is not None and previous_end_ns <= end_ns else end_ns
    return start, end_ns


def step_record(step_id: int, start_ns: int, end_ns: int, sched: SchedulerStatsLike | None,
                it: IterationStatsLike | None, kv: KvGeometry) -> Record:
    """One STEP. Tokens: with iteration details, context-phase tokens are prefill and the rest,
    less the drafts, decode; without them, prefill = prompt tokens computed by requests whose
    prefill completed in this step (chunks count at their last one), decode = one per request
    that decoded. batch_size is 0: vLLM reports no batch membership (no BATCH_MEMBER records)."""
    spec = sched.spec_decoding_stats if sched is not None else None
    drafted = spec.num_draft_tokens if spec is not None else 0
    accepted = spec.num_accepted_tokens if spec is not None else 0
    details = sched.iteration_details if sched is not None else None
    if details is not None:
        prefill, decode = details.num_ctx_tokens, max(0, details.num_generation_tokens - drafted)
    elif it is not None:
        prefill, decode = it.prompt_token_stats.computed, len(it.inter_token_latencies_iter)
    else:
        prefill = decode = 0
    in_use = waiting = running = 0
    if sched is not None:
        in_use = min(kv.total_blocks, max(0, round(sched.kv_cache_usage * kv.total_blocks)))
        waiting = sched.num_waiting_reqs + sched.num_skipped_waiting_reqs
        running = sched.num_running_reqs
    preempted = it.num_preempted_reqs if it is not None else 0
    finished = len(it.finished_requests) if it is not None else 0
    return (RecordKind.STEP, (step_id, start_ns, end_ns, prefill, decode, drafted, accepted, in_use, 0,
                              kv.total_blocks, kv.block_size, waiting, running, 0, preempted, 0, finished))


# -- speculative decoding ------------------------------------------------------------------------
def draft_outcomes(spec: SpecDecodingStatsLike) -> list[tuple[int, int]]:
    """(proposed, accepted) for each draft of one step, rebuilt from vLLM's per-position counters.

    Exact as multisets: drafts with more than i tokens = num_draft_tokens_per_pos[i], and since
    acceptance stops at the first rejection, drafts with more than j accepted =
    num_accepted_tokens_per_pos[j]. So the d-th longest draft has #{i: per_pos[i] > d} tokens,
    and the d-th best accept count is read the same way. When draft lengths vary, the stats do not
    say which length went with which accept count: the longest drafts are paired with the most
    accepted. That pairing is always feasible (accepted_per_pos[i] <= drafted_per_pos[i]) and
    reproduces every per-position counter and both totals."""
    drafted, accepted = list(spec.num_draft_tokens_per_pos), list(spec.num_accepted_tokens_per_pos)
    n = max(spec.num_drafts, drafted[0] if drafted else 0)
    return [(sum(1 for c in drafted if c > d), sum(1 for c in accepted if c > d)) for d in range(n)]


def spec_records(ts_ns: int, spec: SpecDecodingStatsLike) -> list[Record]:
    """One SPEC per draft. vLLM's stats are per step, not per request: request_id and task_id are
    0, and draft/verify times are unknown (0)."""
    out: list[Record] = []
    for proposed, accepted in draft_outcomes(spec):
        mask = (1 << min(accepted, MASK_BITS)) - 1  # accepted drafts are always a prefix
        out.append((RecordKind.SPEC, (ts_ns, 0, 0, 0, mask, 0, proposed, accepted)))
    return out


# -- finished requests -----------------------------------------------------------------------------
def finish_reason_code(reason: object) -> int:
    """vLLM's FinishReason (or its string) -> our FinishReason; error, repetition... -> OTHER."""
    return int(_FINISH.get(str(reason).lower(), FinishReason.OTHER))


def request_records(fin: FinishedRequestStatsLike, request_id: int, finish_ns: int, ctx: RequestContext,
                    prefix_caching: bool = True) -> list[Record]:
    """The whole lifecycle of one finished request, in event order (see the module docstring for
    the reconstruction). PREFIX is written only when prefix caching is on (vLLM counts no queries
    otherwise) and the request was scheduled."""
    hi, lo, task = ctx

    def req(ts: int, event: RequestEvent, v0: int = 0, v1: int = 0, reason: int = 0, end: int = 0) -> Record:
        return RecordKind.REQUEST, (ts, end, request_id, hi, lo, v0, v1, task, int(event), reason)

    e2e = _ns(fin.e2e_latency)
    arrived = finish_ns - (e2e or 0)
    prompt, cached, out_tokens = fin.num_prompt_tokens, fin.num_cached_tokens, fin.num_generation_tokens
    records = [req(arrived, RequestEvent.ARRIVED, prompt)]
    decode, prefill = _ns(fin.decode_time), _ns(fin.prefill_time)
    if out_tokens > 0 and decode is not None and prefill is not None:
        first = max(arrived, finish_ns - decode)
        scheduled = max(arrived, first - prefill)
        records.append(req(scheduled, RequestEvent.SCHEDULED, prompt, cached))
        if prefix_caching:
            records.append((RecordKind.PREFIX, (scheduled, request_id, 0, prompt, cached, task)))
        records.append(req(scheduled, RequestEvent.PREFILL_CHUNK, prompt - cached, cached, end=first))
        for _ in range(fin.num_preemptions):
            records.append(req(scheduled, RequestEvent.PREEMPTED, reason=int(PreemptReason.RECOMPUTE)))
            records.append(req(scheduled, RequestEvent.RESUMED))
        records.append(req(first, RequestEvent.FIRST_TOKEN))
        records.append(req(first, RequestEvent.TOKENS, 1))
        if out_tokens > 1:
            records.append(req(finish_ns, RequestEvent.TOKENS, out_tokens - 1))
    else:
        for _ in range(fin.num_preemptions):
            records.append(req(arrived, RequestEvent.PREEMPTED, reason=int(PreemptReason.RECOMPUTE)))
            records.append(req(arrived, RequestEvent.RESUMED))
    records.append(req(finish_ns, RequestEvent.FINISHED, out_tokens, reason=finish_reason_code(fin.finish_reason)))
    return records
