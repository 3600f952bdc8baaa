"""Span descriptions of a finished request, built from its request_table row and probe events.

Pure: plain dataclasses in, plain dataclasses out; exporter.py turns them into SDK spans. Every
timestamp comes from the engine's monotonic clock and is converted to wall-clock ns once, with the
ring's anchor (`to_wall`), so a request's spans line up with the caller's spans on one time axis.

A request becomes one span named `<operation> <model>` (kind SERVER), in the caller's trace and
under the caller's span when it sent a traceparent, lasting from the body received to the last
byte sent (from arrival to finish for requests that did not come over HTTP). Its children:

    queue     arrival -> first scheduled (-> finish if never scheduled)
    prefill   one per prefill chunk, as the engine ran it
    decode    first token -> finish

Preemptions, resumptions, KV reloads and the first token are span events. The steps that tell
most about the request are linked (a span link to that step's own span, in its own trace, see
step_span): its prefill steps and its slowest steps, at most `step_links` of them (step_links()), so a
slow step shared by many requests is one click away from each of them. Linking every step cost the
agent most of a core at ~115 requests/s of 96 tokens (BENCHMARKS.md, "The agent's OTLP export").

The request's events come in as RequestEvents, built for all requests of a batch in one pass over
the request_events frame (request_events()): a per-request DataFrame cost ~1 ms a request in pandas
calls, a fifth of what the agent spent per exported request.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pandas as pd

from infersight.tracing import semconv as sc
from infersight.tracing.bounded import INT_ITEM, STR_ITEM, TUPLE_ITEM
from infersight.tracing.sampling import Decision, decide

#: Links per request span at most (the SDK's default span limit is 128); the rest are counted in an attribute.
MAX_STEP_LINKS = 128
#: Links per request span by default: its prefill steps and its slowest steps, up to this many.
DEFAULT_STEP_LINKS = 8
#: KV reload events closer than this are one burst (a swapped-in request reloads its blocks together).
RELOAD_BURST_NS = 1_000_000

ToWall = Callable[[int], int]


@dataclass(frozen=True)
class EventDesc:
    name: str
    wall_ns: int
    attributes: sc.Attributes = field(default_factory=dict)


@dataclass
class SpanDesc:
    """One span; times are wall-clock ns. kind: "server" or "internal". step_links: (step id, tokens
    this request fed in that step). error: the status description of a failed span, else None."""

    name: str
    start_ns: int
    end_ns: int
    kind: str = "internal"
    attributes: sc.Attributes = field(default_factory=dict)
    events: list[EventDesc] = field(default_factory=list)
    children: list["SpanDesc"] = field(default_factory=list)
    step_links: list[tuple[int, int]] = field(default_factory=list)
    error: str | None = None


@dataclass
class RequestTrace:
    """Where the request span goes: trace id, the caller's span (0: none, the span is a root) and
    tracestate, plus the sampling decision (the hook exports only kept ones)."""

    trace_id: int
    parent_span_id: int
    trace_state: str
    root: SpanDesc
    decision: Decision


@dataclass
class ServedInfo:
    """What `infersight serve` recorded about a request (SERVED, NETWORK and REQUEST_TEXT records).
    Times are monotonic ns, -1 when unknown (a NETWORK record that never arrived)."""

    operation: str = "text_completion"
    receive_ns: int = -1
    first_byte_ns: int = -1
    last_byte_ns: int = -1
    parent_span_id: int = 0
    remote_parent: bool = False
    parent_sampled: bool = False
    traceparent_invalid: bool = False
    params: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, top_k, max_tokens, seed, stream
    texts: dict[str, str] = field(default_factory=dict)   # session_id, user_id, tracestate, prompt, completion


@dataclass(frozen=True)
class RequestEvents:
    """The request_events rows of one request that its spans show, in time order. chunks: its prefill
    chunks as (start ns, end ns, tokens, start position); marks: its preemptions and resumptions as
    (event, ts ns, reason)."""

    chunks: tuple[tuple[int, int, int, int], ...] = ()
    marks: tuple[tuple[str, int, str], ...] = ()

    def estimated_bytes(self) -> int:
        """Its memory as the buffers' byte bounds count it (tracing.bounded's per-object estimates)."""
        chunk = TUPLE_ITEM + 4 * INT_ITEM
        return TUPLE_ITEM * 2 + chunk * len(self.chunks) + sum(
            TUPLE_ITEM + INT_ITEM + 2 * STR_ITEM + len(reason) for _, _, reason in self.marks)


NO_EVENTS = RequestEvents()
_MARKS = ("PREEMPTED", "RESUMED")


def request_events(events: pd.DataFrame) -> dict[int, RequestEvents]:
    """request id -> its RequestEvents, from a request_events frame (correlate.frames' columns), in one
    pass: rows of other kinds are skipped, and a request with none of these rows is absent (NO_EVENTS)."""
    ev = events[events["event"].isin(("PREFILL_CHUNK", *_MARKS))]
    if ev.empty:
        return {}
    ev = ev.sort_values("ts_ns", kind="stable")
    chunks: dict[int, list[tuple[int, int, int, int]]] = {}
    marks: dict[int, list[tuple[str, int, str]]] = {}
    for rid, kind, ts, end, v0, v1, reason in zip(ev["request_id"].tolist(), ev["event"].tolist(), ev["ts_ns"].tolist(),
                                                  ev["end_ns"].tolist(), ev["value0"].tolist(), ev["value1"].tolist(),
                                                  ev["reason"].tolist()):
        if kind == "PREFILL_CHUNK":
            chunks.setdefault(rid, []).append((ts, end, v0, v1))
        else:
            marks.setdefault(rid, []).append((kind, ts, str(reason)))
    return {rid: RequestEvents(tuple(chunks.get(rid, ())), tuple(marks.get(rid, ()))) for rid in chunks.keys() | marks.keys()}


def step_links(steps: list[tuple[int, int]], step_ns: Mapping[int, int], limit: int) -> list[tuple[int, int]]:
    """The steps a request span links, in step order: its prefill steps (more than one token fed) first,
    then its slowest steps by step_ns (step id -> duration), at most `limit`. Steps without a known
    duration (no longer buffered) come last: their spans cannot be built anyway."""
    if limit <= 0:
        return []
    if len(steps) <= limit:
        return list(steps)
    ranked = sorted(steps, key=lambda s: (s[1] <= 1, -step_ns.get(s[0], -1)))
    return sorted(ranked[:limit])


@dataclass
class RequestInputs:
    """Everything one request's spans are built from. row: a request_table row plus its cost
    (engine_seconds, energy_j, ...) and slow_cause; events: its RequestEvents; spec: (accepted,
    proposed) draft tokens; reload_ns: its KV reload times; steps: (step id, tokens) of the steps
    it took part in; step_ns: the durations of those steps still buffered (step id -> ns), which
    rank them for links; step_link_limit: how many it links (step_links())."""

    row: Mapping[str, Any]
    events: RequestEvents = NO_EVENTS
    served: ServedInfo | None = None
    spec: tuple[int, int] = (0, 0)
    reload_ns: list[int] = field(default_factory=list)
    steps: list[tuple[int, int]] = field(default_factory=list)
    step_ns: Mapping[int, int] = field(default_factory=dict)
    step_link_limit: int = DEFAULT_STEP_LINKS


def request_trace(inp: RequestInputs, to_wall: ToWall, model: str, ratio: float,
                  export_content: bool = False) -> RequestTrace:
    """The request span with its children, and whether sampling keeps it."""
    row, served = inp.row, inp.served or ServedInfo()
    reason = str(row["finish_reason"])
    trace_id = int(str(row["trace_id"]), 16)
    decision = decide(trace_id, ratio, slow=bool(row.get("slow_cause")), failed=reason in sc.FAILED_REASONS,
                      parent_sampled=served.parent_sampled if served.remote_parent else None)
    a, s, t, f = (int(row[c]) for c in ("arrival_ns", "first_scheduled_ns", "first_token_ns", "finish_ns"))
    start = min(a, served.receive_ns) if served.receive_ns >= 0 else a
    end = max(f, served.last_byte_ns)

    attrs: sc.Attributes = {}
    attrs.update(sc.genai(served.operation, model, row, served.params))
    attrs.update(sc.openinference(model, row, served.params))
    attrs.update(sc.identity(served.texts))
    attrs.update(sc.ours(row, *inp.spec))
    attrs[sc.IS + "sampling.rule"] = decision.rule
    if served.first_byte_ns >= 0 and served.receive_ns >= 0:
        attrs[sc.IS + "time_to_first_byte_s"] = (served.first_byte_ns - served.receive_ns) / 1e9
    if served.traceparent_invalid:
        attrs[sc.IS + "traceparent_invalid"] = True
    if t >= 0:
        attrs[sc.LANGFUSE_COMPLETION_START] = sc.iso8601(to_wall(t))
    if export_content:
        attrs.update(sc.content(served.operation, served.texts))
    links = step_links(inp.steps, inp.step_ns, min(inp.step_link_limit, MAX_STEP_LINKS))
    if inp.steps:
        attrs[sc.IS + "steps"] = len(inp.steps)
    if len(inp.steps) > len(links):
        attrs[sc.IS + "step_links_dropped"] = len(inp.steps) - len(links)

    root = SpanDesc(f"{served.operation} {model}", to_wall(start), to_wall(end), "server", attrs,
                    _events(inp, t, to_wall), _phases(inp, a, s, t, f, to_wall), links,
                    f"finish reason {reason}" if reason in sc.FAILED_REASONS else None)
    return RequestTrace(trace_id, served.parent_span_id if served.remote_parent else 0,
                        served.texts.get("tracestate", ""), root, decision)


def _phases(inp: RequestInputs, a: int, s: int, t: int, f: int, to_wall: ToWall) -> list[SpanDesc]:
    """queue, prefill (per chunk) and decode, clamped into [arrival, finish] like request_table."""
    scheduled = min(max(s, a), f) if s >= 0 else f
    spans = [SpanDesc("queue", to_wall(a), to_wall(scheduled), attributes={sc.IS + "phase": "queue"})]
    for start, stop, tokens, position in inp.events.chunks:
        lo, hi = min(max(start, a), f), min(max(stop, a), f)
        spans.append(SpanDesc("prefill", to_wall(lo), to_wall(max(lo, hi)), attributes={
            sc.IS + "phase": "prefill", sc.IS + "prefill.tokens": tokens,
            sc.IS + "prefill.start_position": position}))
    if t >= 0:
        first = min(max(t, scheduled), f)
        attrs: sc.Attributes = {sc.IS + "phase": "decode", sc.GEN_AI_OUTPUT_TOKENS: int(inp.row["output_tokens"])}
        accepted, proposed = inp.spec
        if proposed > 0:
            attrs[sc.IS + "spec.accept_rate"] = accepted / proposed
        spans.append(SpanDesc("decode", to_wall(first), to_wall(f), attributes=attrs))
    return spans


def _events(inp: RequestInputs, t: int, to_wall: ToWall) -> list[EventDesc]:
    out = [EventDesc("first_token", to_wall(t))] if t >= 0 else []
    for kind, ts, reason in inp.events.marks:
        if kind == "PREEMPTED":
            out.append(EventDesc("preempted", to_wall(ts), {sc.IS + "preemption.reason": reason}))
        else:
            out.append(EventDesc("resumed", to_wall(ts)))
    for start, count in _bursts(sorted(inp.reload_ns)):
        out.append(EventDesc("kv_reload", to_wall(start), {sc.IS + "kv.reloaded_blocks": count}))
    return sorted(out, key=lambda e: e.wall_ns)


def _bursts(times: list[int]) -> list[tuple[int, int]]:
    """(first time, count) of runs of sorted times, each within RELOAD_BURST_NS of the one before."""
    runs: list[list[int]] = []  # [first, last, count]
    for ts in times:
        if runs and ts - runs[-1][1] <= RELOAD_BURST_NS:
            runs[-1][1], runs[-1][2] = ts, runs[-1][2] + 1
        else:
            runs.append([ts, ts, 1])
    return [(first, count) for first, _, count in runs]


#: STEP columns written as infersight.step.<column> on step spans.
STEP_FIELDS = ("step_id", "prefill_tokens", "decode_tokens", "spec_tokens", "spec_accepted", "batch_size",
               "kv_blocks_in_use", "kv_blocks_cached", "kv_blocks_total", "waiting", "running", "swapped",
               "preempted", "finished")


def step_span(step: Mapping[str, Any], to_wall: ToWall, gpu: Mapping[str, float] | None = None) -> SpanDesc:
    """One engine step (a row of the steps frame), as a root span in a trace of its own: steps are
    shared by many requests from many traces, so they belong to none of them. `gpu`: the GPU
    telemetry covering the step (field -> value), written as infersight.gpu.<field>."""
    attrs: sc.Attributes = {sc.IS + "step." + ("id" if k == "step_id" else k): int(step[k]) for k in STEP_FIELDS}
    for field, value in (gpu or {}).items():
        attrs[sc.IS + "gpu." + field] = float(value)
    return SpanDesc("engine.step", to_wall(int(step["start_ns"])), to_wall(int(step["end_ns"])), "internal", attrs)


def kernel_attributes(summary: Mapping[str, Any]) -> sc.Attributes:
    """A capture's kernel summary of one request as span attributes: its share of the captured
    steps' GPU kernel time, and the top categories (parallel arrays, as OTel attributes allow)."""
    top = list(summary.get("top", []))
    return {sc.IS + "kernel.ns": int(summary["kernel_ns"]),
            sc.IS + "kernel.top_categories": [str(t["category"]) for t in top],
            sc.IS + "kernel.top_ns": [int(t["kernel_ns"]) for t in top],
            sc.IS + "kernel.top_shares": [float(t["share"]) for t in top]}
