"""Probe records -> one DataFrame per stream, with documented columns.

Every analysis in `correlate` takes these frames and never mutates them. Timestamps stay in
monotonic ns of the engine process (`*_ns` columns); durations derived from them are seconds.
Decoded from records, the name columns of the big streams (request_events task/event/reason, spec
and prefix task) are pandas Categoricals of the names that occur, sorted (they compare, sort and
group as the strings do); concatenate such frames with `concat_frames`, which keeps them so.

request_events   ts_ns, end_ns, request_id, trace_id (32 hex chars), task, event, reason, value0, value1
                 event in ARRIVED SCHEDULED PREFILL_CHUNK FIRST_TOKEN TOKENS PREEMPTED RESUMED FINISHED;
                 value0/value1: see infersight.probes.records.RequestEvent; reason: "" | recompute | swap |
                 stop | length | abort | other.
steps            step_id, start_ns, end_ns, prefill_tokens, decode_tokens, spec_tokens, spec_accepted,
                 kv_blocks_in_use, kv_blocks_cached, kv_blocks_total, kv_block_size, waiting, running, swapped, preempted,
                 batch_size, finished
batch            step_id, request_id, num_tokens         (who was in each step, with how many tokens fed)
kv_events        ts_ns, event, block_id, request_id, block_hash    (event: KVBlockEvent names, lower case;
                 on evicted, request_id is the request whose allocation evicted the block, -1 when unknown)
moe              step_id, layer, expert, tokens          (long format, one row per (step, layer, expert))
spec             ts_ns, request_id, task, proposed, accepted, accept_mask, draft_ns, verify_ns
step_timing      step_id, start_ns, end_ns, schedule_ns, draft_ns, target_ns, decode_requests, prefill_tokens,
                 spec_tokens, spec_accepted, draft_forwards, spec_probe, graph_captures, profiled, kv_moves,
                 launched_ahead, launched_next   (one row per step of
                 an engine that times its parts: draft_ns covers every draft forward, target_ns the target
                 forward, -1 when unknown; spec_probe (bool): a decode step run without speculation on
                 purpose, see infersight.runtime.speculative.spec_probe; graph_captures: CUDA graphs the step captured,
                 a one-time cost that makes it no sample of the steady step time; profiled (bool): torch.profiler
                 recorded the step (a capture window: eager, under its callbacks), no sample either; kv_moves:
                 requests its schedule preempted or swapped in, KV pressure, no sample either; launched_ahead,
                 launched_next (bool): async scheduling launched the step before the step before it was read,
                 and launched the step after it before it was read; both: a steady async step)
prefix           ts_ns, request_id, task, prompt_tokens, cached_tokens, group_hash
network          request_id, receive_ns, first_byte_ns, last_byte_ns   (requests served over HTTP by
                 `infersight serve`: body received, first and last response body byte sent)
served           request_id, receive_ns, parent_span_id, operation, stream, remote_parent, parent_sampled,
                 traceparent_invalid, temperature, top_p, top_k, seed, max_tokens   (one row per served request,
                 written at arrival; operation: chat | text_completion; seed -1: none; parent_span_id 0: none)
texts            request_id, field, offset, total, data   (chunks of a served request's strings; field:
                 session_id | user_id | tracestate | prompt | completion; data: bytes; join with join_texts)
ep               step_id, layer, rank, world, chunk, dispatch_ns, compute_ns, combine_ns, gather_ns, total_ns,
                 bytes_to_peer, expert_ids, expert_tokens   (expert-parallel runs: one row per (step, MoE
                 layer, rank), from each rank's own ring; step ids are the engines' own, equal across ranks.
                 bytes_to_peer: tuple of `world` ints, activation bytes dispatched to each rank (own rank: a
                 local copy; combine sends the same rows back); expert_ids, expert_tokens: tuples over the
                 rank's local expert slots, global expert id and tokens received. A rank with more than 8
                 peers or 24 local experts writes extra rows, chunk 1, 2, ..., continuing the tuples at peer
                 chunk*8 and slot chunk*24 (timings repeated); correlate.expert_parallel handles both)
host_pauses      ts_ns, end_ns, collected, missed, generation, ring_index   (one row per garbage collection that
                 stalled the engine's process for at least ProbeConfig.host_pause_min_s: from its start to its
                 end, the objects it freed, its generation 0-2, how many pauses before it the producer did not
                 keep (infersight.probes.host_pauses); ring_index: the agent's index of the ring it came from,
                 0 as decoded, the same index request ids carry above bit 48 (agent.rings.ingest))
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import pandas as pd

from infersight.probes.records import (
    FinishReason, Operation, PreemptReason, RecordKind, RequestEvent, ServedFlag, TextField, record_dtype,
)
from infersight.runtime.observer import KVBlockEvent

REQUEST_EVENT_NAMES = {int(e): e.name for e in RequestEvent}
KV_EVENT_NAMES = {int(e): e.name.lower() for e in KVBlockEvent}
_PREEMPT_NAMES = {int(e): e.name.lower() for e in PreemptReason}
_FINISH_NAMES = {int(e): e.name.lower() for e in FinishReason}


def _build_empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    """An empty frame with these columns: a copy of the schema's template (a copy costs ~7 us,
    building one from Series ~0.7 ms, and the agent makes dozens per poll)."""
    template = _EMPTY_TEMPLATES.get(id(columns))
    return template.copy() if template is not None else _build_empty(columns)


REQUEST_COLUMNS = {"ts_ns": "int64", "end_ns": "int64", "request_id": "int64", "trace_id": "object",
                   "task": "object", "event": "object", "reason": "object", "value0": "int64", "value1": "int64"}
STEP_COLUMNS = {name: "int64" for name in record_dtype(RecordKind.STEP).names}
BATCH_COLUMNS = {"step_id": "int64", "request_id": "int64", "num_tokens": "int64"}
KV_COLUMNS = {"ts_ns": "int64", "event": "object", "block_id": "int64", "request_id": "int64", "block_hash": "uint64"}
MOE_COLUMNS = {"step_id": "int64", "layer": "int64", "expert": "int64", "tokens": "int64"}
SPEC_COLUMNS = {"ts_ns": "int64", "request_id": "int64", "task": "object", "proposed": "int64", "accepted": "int64",
                "accept_mask": "uint64", "draft_ns": "int64", "verify_ns": "int64"}
STEP_TIMING_COLUMNS = {**{name: "int64" for name in record_dtype(RecordKind.STEP_TIMING).names}, "spec_probe": "bool",
                       "profiled": "bool", "launched_ahead": "bool", "launched_next": "bool"}
PREFIX_COLUMNS = {"ts_ns": "int64", "request_id": "int64", "task": "object", "prompt_tokens": "int64",
                  "cached_tokens": "int64", "group_hash": "uint64"}
NETWORK_COLUMNS = {"request_id": "int64", "receive_ns": "int64", "first_byte_ns": "int64", "last_byte_ns": "int64"}
SERVED_COLUMNS = {"request_id": "int64", "receive_ns": "int64", "parent_span_id": "uint64", "operation": "object",
                  "stream": "bool", "remote_parent": "bool", "parent_sampled": "bool", "traceparent_invalid": "bool",
                  "temperature": "float64", "top_p": "float64", "top_k": "int64", "seed": "int64",
                  "max_tokens": "int64"}
TEXT_COLUMNS = {"request_id": "int64", "field": "object", "offset": "int64", "total": "int64", "data": "object"}
EP_COLUMNS = {"step_id": "int64", "layer": "int64", "rank": "int64", "world": "int64", "chunk": "int64",
              "dispatch_ns": "int64", "compute_ns": "int64", "combine_ns": "int64", "gather_ns": "int64",
              "total_ns": "int64", "bytes_to_peer": "object", "expert_ids": "object", "expert_tokens": "object"}
HOST_PAUSE_COLUMNS = {**{name: "int64" for name in record_dtype(RecordKind.HOST_PAUSE).names}, "ring_index": "int64"}
#: One empty frame per schema above, built at import and only ever copied (never handed out itself).
_EMPTY_TEMPLATES = {id(c): _build_empty(c) for c in (
    REQUEST_COLUMNS, STEP_COLUMNS, BATCH_COLUMNS, KV_COLUMNS, MOE_COLUMNS, SPEC_COLUMNS, STEP_TIMING_COLUMNS,
    PREFIX_COLUMNS, NETWORK_COLUMNS, SERVED_COLUMNS, TEXT_COLUMNS, EP_COLUMNS, HOST_PAUSE_COLUMNS)}
OPERATION_NAMES = {int(o): o.name.lower() for o in Operation}
TEXT_FIELD_NAMES = {int(f): f.name.lower() for f in TextField}


#: pandas' str dtype (Arrow-backed where pyarrow is installed): what a column of Python strings becomes.
_STR_DTYPE = pd.api.types.pandas_dtype("str")


def _take_names(names: np.ndarray, codes: np.ndarray) -> pd.Series | np.ndarray:
    """names[codes] as a str column. Built in Arrow (a take over the few distinct names) when the str
    dtype is Arrow-backed: some 10x cheaper than pandas inferring it from a column of Python strings."""
    if getattr(_STR_DTYPE, "storage", None) != "pyarrow":
        return names[codes]
    import pyarrow as pa  # already loaded by pandas for its str dtype

    taken = pa.array(names.tolist(), pa.large_string()).take(pa.array(np.asarray(codes, np.int64)))
    return taken.to_pandas(types_mapper={pa.large_string(): _STR_DTYPE}.get)


#: CategoricalDtype by its categories: building one (its str Index) costs ~0.2 ms, and every poll
#: makes a few with the same few names. Bounded: started over past _MAX_DTYPES distinct sets.
_DTYPES: dict[tuple[str, ...], pd.CategoricalDtype] = {}
_MAX_DTYPES = 1024


def _categorical(table: np.ndarray, codes: np.ndarray) -> pd.Categorical:
    """table[codes] (table: names indexed by code) as a Categorical whose categories are the names
    that occur, sorted: it sorts, groups and factorizes as the strings would, and filtering or
    comparing it costs a small-integer take or compare per row, not a string copy or compare."""
    used = np.flatnonzero(np.bincount(codes, minlength=len(table)))  # codes < len(table) <= 65536: one pass
    names = table[used]
    categories, inverse = np.unique(names.astype(str), return_inverse=True)  # names sorted; equal names merged
    recode = np.zeros(len(table), np.int64)
    recode[used] = inverse.reshape(-1)
    key = tuple(categories.tolist())
    dtype = _DTYPES.get(key)
    if dtype is None:
        if len(_DTYPES) >= _MAX_DTYPES:
            _DTYPES.clear()
        dtype = _DTYPES[key] = pd.CategoricalDtype(list(key))  # unordered, as from_codes(categories=...) makes it
    return pd.Categorical.from_codes(recode[codes], dtype=dtype, validate=False)


def concat_frames(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """pd.concat(parts, ignore_index=True), keeping categorical columns categorical: parts whose
    categories differ are recoded to the sorted union first (pd.concat would fall back to object,
    and every later filter of the frame would copy strings again)."""
    if len(parts) > 1:
        for col, dtype in parts[0].dtypes.items():
            if not isinstance(dtype, pd.CategoricalDtype):
                continue
            dtypes = [p[col].dtype for p in parts if col in p.columns]
            if len(dtypes) == len(parts) and all(isinstance(d, pd.CategoricalDtype) for d in dtypes) \
                    and any(d != dtype for d in dtypes):
                union = pd.CategoricalDtype(sorted(set().union(*(d.categories.tolist() for d in dtypes))))
                parts = [p if p[col].dtype == union else p.astype({col: union}) for p in parts]
    return pd.concat(parts, ignore_index=True)


def trace_hex(hi: np.ndarray, lo: np.ndarray, request_id: np.ndarray) -> pd.Series:
    """32-hex-digit trace ids, formatted once per request (a request has one trace id and many events)."""
    codes, uniques = pd.factorize(np.asarray(request_id))
    first = np.empty(len(uniques), dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes))[::-1]
    hi, lo = hi[first].tolist(), lo[first].tolist()
    names = np.array([f"{h:016x}{l:016x}" for h, l in zip(hi, lo)], dtype=object)
    # object, not str: trace ids are carried through every filter of the events (an object take
    # copies pointers; an Arrow take would copy 32 bytes per row) and never compared in bulk.
    return pd.Series(names[codes], dtype=object, copy=False)


def _table(codes: np.ndarray, names: dict[int, str], default: str) -> np.ndarray:
    """The code -> name table for these codes (unknown codes -> default), indexed by code."""
    size = max(int(codes.max(initial=0)), max(names, default=0)) + 1
    table = np.full(size, default, dtype=object)
    for code, name in names.items():
        table[code] = name
    return table


def _lookup(codes: np.ndarray, names: dict[int, str], default: str) -> pd.Categorical:
    """Vectorised code -> name: one table indexed by code, unknown codes -> default. Codes come from
    u8/u16 record fields, so the table has at most 65536 entries."""
    codes = np.asarray(codes, np.int64)
    return _categorical(_table(codes, names, default), codes)


def _lookup_str(codes: np.ndarray, names: dict[int, str], default: str) -> pd.Series | np.ndarray:
    """As _lookup, as a str column (the small streams, whose analyses count values per name)."""
    codes = np.asarray(codes, np.int64)
    return _take_names(_table(codes, names, default), codes)


def task_names(task_ids: np.ndarray, labels: dict[int, str]) -> pd.Categorical:
    return _lookup(task_ids, labels, "other")


#: REQUEST reason codes are per event: PREEMPTED's are PreemptReason, FINISHED's FinishReason.
_REASON_NAMES = {**{int(RequestEvent.PREEMPTED) << 8 | c: n for c, n in _PREEMPT_NAMES.items()},
                 **{int(RequestEvent.FINISHED) << 8 | c: n for c, n in _FINISH_NAMES.items()}}


def _frame(columns: dict[str, object]) -> pd.DataFrame:
    """A frame over these freshly built column arrays, without copying them: pandas would otherwise
    copy every same-dtype column into one 2-D block (a second copy of the whole stream, per poll)."""
    return pd.DataFrame(columns, copy=False)


def request_frame(rec: np.ndarray, labels: dict[int, str]) -> pd.DataFrame:
    if len(rec) == 0:
        return _empty(REQUEST_COLUMNS)
    events = rec["event"].astype(np.int64)
    reason_codes = np.where((events == RequestEvent.PREEMPTED) | (events == RequestEvent.FINISHED),
                            events << 8 | rec["reason"].astype(np.int64), 0)
    return _frame({
        "ts_ns": rec["ts_ns"].astype(np.int64), "end_ns": rec["end_ns"].astype(np.int64),
        "request_id": rec["request_id"].astype(np.int64), "trace_id": trace_hex(rec["trace_hi"], rec["trace_lo"], rec["request_id"]),
        "task": task_names(rec["task_id"], labels),
        "event": _lookup(events, REQUEST_EVENT_NAMES, "UNKNOWN"),
        "reason": _lookup(reason_codes, _REASON_NAMES, ""), "value0": rec["value0"].astype(np.int64), "value1": rec["value1"].astype(np.int64)})


def step_frame(rec: np.ndarray) -> pd.DataFrame:
    if len(rec) == 0:
        return _empty(STEP_COLUMNS)
    return _frame({name: rec[name].astype(np.int64) for name in STEP_COLUMNS})


def batch_frame(rec: np.ndarray) -> pd.DataFrame:
    if len(rec) == 0:
        return _empty(BATCH_COLUMNS)
    return _frame({name: rec[name].astype(np.int64) for name in BATCH_COLUMNS})


def kv_frame(rec: np.ndarray) -> pd.DataFrame:
    if len(rec) == 0:
        return _empty(KV_COLUMNS)
    return _frame({
        "ts_ns": rec["ts_ns"].astype(np.int64),
        "event": _lookup_str(rec["event"], KV_EVENT_NAMES, "unknown"),
        "block_id": rec["block_id"].astype(np.int64), "request_id": rec["request_id"].astype(np.int64),
        "block_hash": rec["block_hash"].astype(np.uint64)})


def moe_frame(rec: np.ndarray) -> pd.DataFrame:
    """Long format: each record holds up to 64 experts starting at expert_offset."""
    if len(rec) == 0:
        return _empty(MOE_COLUMNS)
    counts = rec["counts"]
    offset = rec["expert_offset"].astype(np.int64)
    k = np.clip(rec["n_experts"].astype(np.int64) - offset, 0, counts.shape[1])  # valid experts per record
    rows = np.repeat(np.arange(len(rec)), k)
    within = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)  # 0..k-1 in each record
    # Fields converted per record, then repeated: a gather from the records' strided fields costs more.
    return _frame({"step_id": rec["step_id"].astype(np.int64)[rows], "layer": rec["layer"].astype(np.int64)[rows],
                   "expert": offset[rows] + within, "tokens": counts[rows, within].astype(np.int64)})


def spec_frame(rec: np.ndarray, labels: dict[int, str]) -> pd.DataFrame:
    if len(rec) == 0:
        return _empty(SPEC_COLUMNS)
    return _frame({
        "ts_ns": rec["ts_ns"].astype(np.int64), "request_id": rec["request_id"].astype(np.int64),
        "task": task_names(rec["task_id"], labels), "proposed": rec["proposed"].astype(np.int64),
        "accepted": rec["accepted"].astype(np.int64), "accept_mask": rec["accept_mask"].astype(np.uint64),
        "draft_ns": rec["draft_ns"].astype(np.int64), "verify_ns": rec["verify_ns"].astype(np.int64)})


def step_timing_frame(rec: np.ndarray) -> pd.DataFrame:
    if len(rec) == 0:
        return _empty(STEP_TIMING_COLUMNS)
    return _frame({name: rec[name].astype(dtype) for name, dtype in STEP_TIMING_COLUMNS.items()})


def host_pause_frame(rec: np.ndarray) -> pd.DataFrame:
    if len(rec) == 0:
        return _empty(HOST_PAUSE_COLUMNS)
    return _frame({**{name: rec[name].astype(np.int64) for name in rec.dtype.names},
                   "ring_index": np.zeros(len(rec), np.int64)})


def prefix_frame(rec: np.ndarray, labels: dict[int, str]) -> pd.DataFrame:
    if len(rec) == 0:
        return _empty(PREFIX_COLUMNS)
    return _frame({
        "ts_ns": rec["ts_ns"].astype(np.int64), "request_id": rec["request_id"].astype(np.int64),
        "task": task_names(rec["task_id"], labels), "prompt_tokens": rec["prompt_tokens"].astype(np.int64),
        "cached_tokens": rec["cached_tokens"].astype(np.int64), "group_hash": rec["group_hash"].astype(np.uint64)})


def network_frame(rec: np.ndarray) -> pd.DataFrame:
    if len(rec) == 0:
        return _empty(NETWORK_COLUMNS)
    return _frame({name: rec[name].astype(np.int64) for name in NETWORK_COLUMNS})


def served_frame(rec: np.ndarray) -> pd.DataFrame:
    if len(rec) == 0:
        return _empty(SERVED_COLUMNS)
    flags = rec["flags"].astype(np.int64)
    return _frame({
        "request_id": rec["request_id"].astype(np.int64), "receive_ns": rec["receive_ns"].astype(np.int64),
        "parent_span_id": rec["parent_span_id"].astype(np.uint64),
        "operation": _lookup_str(rec["operation"], OPERATION_NAMES, "text_completion"),
        "stream": (flags & ServedFlag.STREAM) != 0, "remote_parent": (flags & ServedFlag.REMOTE_PARENT) != 0,
        "parent_sampled": (flags & ServedFlag.PARENT_SAMPLED) != 0,
        "traceparent_invalid": (flags & ServedFlag.TRACEPARENT_INVALID) != 0,
        "temperature": rec["temperature"].astype(np.float64), "top_p": rec["top_p"].astype(np.float64),
        "top_k": rec["top_k"].astype(np.int64), "seed": rec["seed"].astype(np.int64),
        "max_tokens": rec["max_tokens"].astype(np.int64)})


def text_frame(rec: np.ndarray) -> pd.DataFrame:
    if len(rec) == 0:
        return _empty(TEXT_COLUMNS)
    n = rec["nbytes"].astype(np.int64)
    data = np.empty(len(rec), dtype=object)
    data[:] = [bytes(d)[:k] for d, k in zip(rec["data"], n.tolist())]  # S fields drop trailing NULs; slice anyway
    return _frame({
        "request_id": rec["request_id"].astype(np.int64), "field": _lookup_str(rec["field"], TEXT_FIELD_NAMES, "unknown"),
        "offset": rec["offset"].astype(np.int64), "total": rec["total"].astype(np.int64), "data": data})


def join_texts(texts: pd.DataFrame) -> dict[tuple[int, str], str]:
    """(request_id, field) -> text, from the chunks of `texts`. A string some of whose chunks were
    lost (ring drops) keeps what arrived, in order; bytes cut inside a UTF-8 sequence are dropped."""
    out: dict[tuple[int, str], str] = {}
    for (rid, name), g in texts.sort_values("offset", kind="stable").groupby(["request_id", "field"], sort=False):
        raw = b"".join(g.drop_duplicates("offset")["data"].tolist())[: int(g["total"].max())]
        out[(int(rid), str(name))] = raw.decode("utf-8", "ignore")
    return out


def ep_frame(rec: np.ndarray) -> pd.DataFrame:
    """One row per EP_STATS record. Chunk c's tuples start at peer c*8 and local slot c*24 (only
    ranks with more peers or slots than that write chunks > 0); the timings repeat in every chunk."""
    if len(rec) == 0:
        return _empty(EP_COLUMNS)
    chunk = rec["chunk"].astype(np.int64)
    n_peers = np.clip(rec["world"].astype(np.int64) - chunk * rec["bytes_to_peer"].shape[1], 0, None)
    n_slots = np.clip(rec["n_slots"].astype(np.int64) - chunk * rec["expert_ids"].shape[1], 0, None)

    def tuples(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
        out = np.empty(len(counts), dtype=object)
        for i, (v, n) in enumerate(zip(values.tolist(), counts.tolist())):
            out[i] = tuple(v[:n])  # one by one: a slice assignment would unpack equal-length tuples
        return out

    columns: dict[str, object] = {name: rec[name].astype(np.int64) for name, t in EP_COLUMNS.items() if t != "object"}
    columns.update(bytes_to_peer=tuples(rec["bytes_to_peer"], n_peers), expert_ids=tuples(rec["expert_ids"], n_slots),
                   expert_tokens=tuples(rec["expert_tokens"], n_slots))
    return _frame(columns)


@dataclass
class EventFrames:
    """One batch of decoded probe events (or the concatenation of several)."""

    request_events: pd.DataFrame = field(default_factory=lambda: _empty(REQUEST_COLUMNS))
    steps: pd.DataFrame = field(default_factory=lambda: _empty(STEP_COLUMNS))
    batch: pd.DataFrame = field(default_factory=lambda: _empty(BATCH_COLUMNS))
    kv_events: pd.DataFrame = field(default_factory=lambda: _empty(KV_COLUMNS))
    moe: pd.DataFrame = field(default_factory=lambda: _empty(MOE_COLUMNS))
    spec: pd.DataFrame = field(default_factory=lambda: _empty(SPEC_COLUMNS))
    prefix: pd.DataFrame = field(default_factory=lambda: _empty(PREFIX_COLUMNS))
    network: pd.DataFrame = field(default_factory=lambda: _empty(NETWORK_COLUMNS))
    served: pd.DataFrame = field(default_factory=lambda: _empty(SERVED_COLUMNS))
    texts: pd.DataFrame = field(default_factory=lambda: _empty(TEXT_COLUMNS))
    ep: pd.DataFrame = field(default_factory=lambda: _empty(EP_COLUMNS))
    step_timing: pd.DataFrame = field(default_factory=lambda: _empty(STEP_TIMING_COLUMNS))
    host_pauses: pd.DataFrame = field(default_factory=lambda: _empty(HOST_PAUSE_COLUMNS))

    @classmethod
    def from_records(cls, records: dict[int, np.ndarray], labels: dict[int, str]) -> "EventFrames":
        """records: what RingConsumer.read() returns; labels: task id -> name seen so far."""
        empty = np.empty(0)

        def get(kind: RecordKind) -> np.ndarray:
            return records.get(int(kind), empty)

        return cls(request_frame(get(RecordKind.REQUEST), labels), step_frame(get(RecordKind.STEP)),
                   batch_frame(get(RecordKind.BATCH_MEMBER)), kv_frame(get(RecordKind.KV_BLOCK)),
                   moe_frame(get(RecordKind.MOE)), spec_frame(get(RecordKind.SPEC), labels),
                   prefix_frame(get(RecordKind.PREFIX), labels), network_frame(get(RecordKind.NETWORK)),
                   served_frame(get(RecordKind.SERVED)), text_frame(get(RecordKind.REQUEST_TEXT)),
                   ep=ep_frame(get(RecordKind.EP_STATS)), step_timing=step_timing_frame(get(RecordKind.STEP_TIMING)),
                   host_pauses=host_pause_frame(get(RecordKind.HOST_PAUSE)))

    def concat(self, other: "EventFrames") -> "EventFrames":
        def cat(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
            if b.empty:
                return a
            return b if a.empty else concat_frames([a, b])

        return EventFrames(*(cat(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)))


def update_labels(labels: dict[int, str], records: dict[int, np.ndarray]) -> dict[int, str]:
    """Labels plus those announced by TASK_LABEL records (a new dict; the input is not changed)."""
    out = {0: "other", **labels}
    for rec in records.get(int(RecordKind.TASK_LABEL), np.empty(0)):
        out[int(rec["task_id"])] = bytes(rec["label"]).rstrip(b"\0").decode("utf-8", "replace")
    return out
