"""The probe record types: one fixed-size layout per event stream, versioned.

Each layout is written once here as (field, struct code) pairs, from which come both the
producer's `struct.Struct` (packing a record costs one call) and the consumer's numpy dtype
(decoding a batch is one view). Timestamps are time.monotonic_ns() of the engine process; the
ring header carries the wall-clock anchor that converts them.
"""
from __future__ import annotations

import enum

import numpy as np

from infersight.probes.record_batches import BatchedKinds
from infersight.probes.record_encoding import RecordStruct
from infersight.probes.schema import RecordRegistry, RecordType

#: Experts per MoE record; a layer with more experts spans several records (expert_offset).
MOE_EXPERTS_PER_RECORD = 64
#: TOKENS events per TOKENS_BATCH record and batch members per MEMBERS_BATCH record: as many as fit
#: the slot the MOE record needs (probes.record_batches), so batching never grows the slot.
TOKENS_PER_RECORD = 7
MEMBERS_PER_RECORD = 21


class RecordKind(enum.IntEnum):
    REQUEST = 1
    STEP = 2
    BATCH_MEMBER = 3
    KV_BLOCK = 4
    MOE = 5
    SPEC = 6
    PREFIX = 7
    TASK_LABEL = 8
    STEP_TIMING = 12
    # A step's TOKENS events and batch members, many to a record (probes.record_batches): readers
    # see them as REQUEST (TOKENS) and BATCH_MEMBER records, in ring order.
    TOKENS_BATCH = 13
    MEMBERS_BATCH = 14
    # Written by `infersight serve`, not by the engine's observer callbacks (see below).
    NETWORK = 9
    SERVED = 10
    REQUEST_TEXT = 11
    # Written by expert-parallel ranks (infersight.runtime.parallel), one ring per rank.
    EP_STATS = 20
    # The GPUs the producing process uses (probes.gpu_uuids), one record each: written when the ring
    # is created and again every GPU_RECORD_EVERY_S, so an agent that attaches later learns them too.
    GPU = 21
    # The name of the engine the producing process belongs to (probes.records.engine_name_bytes), one
    # record: written when the ring is created and again with the GPU records, every GPU_RECORD_EVERY_S.
    # An agent that reads several rings labels each engine's series with it (agent.rings.engine_scope); the
    # rings of one engine (vLLM's API server and its workers) announce the same name.
    ENGINE = 22
    # A stall of the producing process in Python's cyclic garbage collector (probes.host_pauses), one
    # record per collection at least ProbeConfig.host_pause_min_s long.
    HOST_PAUSE = 23


# -- records of requests that came through the HTTP server (`infersight serve`) ----------------------
# The server's engine thread writes them (the ring has one producer): SERVED right after
# Engine.add_request, so it precedes the request's FINISHED; REQUEST_TEXT chunks (session and user
# ids, the caller's tracestate, and prompt/completion text only with --export-content) before
# NETWORK; NETWORK after the response's last byte, hence after FINISHED. The sidecar holds a
# SERVED request's row until its NETWORK record arrives.

#: Bytes of a GPU record's uuid ("GPU-" + 36, "MIG-" + 36, or an old-style MIG-GPU-.../gi/ci name).
GPU_UUID_BYTES = 64
#: How often a producer writes its GPU records again (seconds, on its monotonic clock).
GPU_RECORD_EVERY_S = 5.0

#: Bytes of an ENGINE record's name: printable ASCII, cut to this length (a label value, so bounded).
ENGINE_NAME_BYTES = 32

#: Bytes of text per REQUEST_TEXT record: sized so the record fits the slot the MOE record needs.
TEXT_CHUNK_BYTES = 240


class Operation(enum.IntEnum):
    """The API operation of a served request (GenAI `gen_ai.operation.name`)."""

    TEXT_COMPLETION = 1
    CHAT = 2


class ServedFlag(enum.IntFlag):
    STREAM = 1               # the response was streamed (SSE)
    REMOTE_PARENT = 2        # parent_span_id is the caller's span (from a valid traceparent)
    PARENT_SAMPLED = 4       # the caller's traceparent had the sampled flag
    TRACEPARENT_INVALID = 8  # a traceparent header was present but malformed: a new trace was started


class TextField(enum.IntEnum):
    SESSION_ID = 1
    USER_ID = 2
    TRACESTATE = 3
    PROMPT = 4        # only with --export-content
    COMPLETION = 5    # only with --export-content


# -- expert-parallel stats (EP_STATS): one record per (step, MoE layer, rank), more when it overflows --
# The per-peer bytes and per-local-expert counts are split over records `chunk` = 0, 1, ...: chunk c
# carries peers [c*EP_PEERS_PER_RECORD, ...) and local expert slots [c*EP_EXPERTS_PER_RECORD, ...);
# the timings repeat in every chunk. Sized so the record fits the slot the MOE record needs.
EP_PEERS_PER_RECORD = 8
EP_EXPERTS_PER_RECORD = 24


class RequestEvent(enum.IntEnum):
    ARRIVED = 1          # value0 = prompt tokens
    SCHEDULED = 2        # value0 = prompt tokens, value1 = cached prefix tokens
    PREFILL_CHUNK = 3    # ts_ns..end_ns, value0 = tokens, value1 = first position
    FIRST_TOKEN = 4
    TOKENS = 5           # value0 = tokens emitted this step
    PREEMPTED = 6        # reason = PreemptReason
    RESUMED = 7
    FINISHED = 8         # reason = FinishReason, value0 = output tokens
    POLICY_ARM = 9       # value0 = PolicyArm (1 treatment, 2 control), value1 = the policy seq (probes.policy_block)


class PreemptReason(enum.IntEnum):
    RECOMPUTE = 1
    SWAP = 2


class FinishReason(enum.IntEnum):
    STOP = 1
    LENGTH = 2
    ABORT = 3
    OTHER = 4


_LAYOUTS: dict[RecordKind, tuple[int, list[tuple[str, str]]]] = {
    RecordKind.REQUEST: (1, [("ts_ns", "q"), ("end_ns", "q"), ("request_id", "Q"), ("trace_hi", "Q"),
                             ("trace_lo", "Q"), ("value0", "q"), ("value1", "q"), ("task_id", "H"),
                             ("event", "B"), ("reason", "B")]),
    RecordKind.STEP: (1, [("step_id", "Q"), ("start_ns", "q"), ("end_ns", "q"), ("prefill_tokens", "I"),
                          ("decode_tokens", "I"), ("spec_tokens", "I"), ("spec_accepted", "I"),
                          ("kv_blocks_in_use", "I"), ("kv_blocks_cached", "I"), ("kv_blocks_total", "I"), ("kv_block_size", "I"), ("waiting", "I"),
                          ("running", "I"), ("swapped", "I"), ("preempted", "I"), ("batch_size", "I"),
                          ("finished", "I")]),
    RecordKind.BATCH_MEMBER: (1, [("step_id", "Q"), ("request_id", "Q"), ("num_tokens", "I")]),
    RecordKind.KV_BLOCK: (1, [("ts_ns", "q"), ("request_id", "q"), ("block_hash", "Q"), ("block_id", "I"),
                              ("event", "B")]),
    RecordKind.MOE: (1, [("step_id", "Q"), ("layer", "H"), ("expert_offset", "H"), ("n_experts", "H"),
                         ("counts", f"{MOE_EXPERTS_PER_RECORD}I")]),
    RecordKind.SPEC: (1, [("ts_ns", "q"), ("request_id", "Q"), ("draft_ns", "q"), ("verify_ns", "q"),
                          ("accept_mask", "Q"), ("task_id", "H"), ("proposed", "H"), ("accepted", "H")]),
    RecordKind.PREFIX: (1, [("ts_ns", "q"), ("request_id", "Q"), ("group_hash", "Q"), ("prompt_tokens", "I"),
                            ("cached_tokens", "I"), ("task_id", "H")]),
    RecordKind.TASK_LABEL: (1, [("task_id", "H"), ("label", "32s")]),
    # -- where one step's time went, whether it was a plain probe step (runtime.speculative.spec_probe) and how
    # many CUDA graphs it captured (a one-time cost: no sample of the steady step time), whether
    # torch.profiler recorded it and how many requests its schedule preempted or swapped in (no
    # sample either; v2), and whether async scheduling launched it ahead and launched the step after it
    # ahead (both: a steady async step; v3):
    # schedule / draft (all draft forwards, their sampling) / target forward (device time on CUDA; -1
    # unknown); the rest of end_ns - start_ns is sampling, verification and commit.
    RecordKind.STEP_TIMING: (3, [("step_id", "Q"), ("start_ns", "q"), ("end_ns", "q"), ("schedule_ns", "q"),
                                 ("draft_ns", "q"), ("target_ns", "q"), ("decode_requests", "I"),
                                 ("prefill_tokens", "I"), ("spec_tokens", "I"), ("spec_accepted", "I"),
                                 ("draft_forwards", "H"), ("spec_probe", "B"), ("graph_captures", "H"),
                                 ("profiled", "B"), ("kv_moves", "H"), ("launched_ahead", "B"),
                                 ("launched_next", "B")]),
    # -- the batched forms of REQUEST (event TOKENS; end_ns, value1, reason 0) and BATCH_MEMBER: `count`
    # entries, each entry the i-th element of every array field (the arrays past `count` are zero).
    # value0 (tokens emitted) is narrower than REQUEST's: a count outside u32 goes as a REQUEST record.
    RecordKind.TOKENS_BATCH: (1, [("ts_ns", f"{TOKENS_PER_RECORD}q"), ("request_id", f"{TOKENS_PER_RECORD}Q"),
                                  ("trace_hi", f"{TOKENS_PER_RECORD}Q"), ("trace_lo", f"{TOKENS_PER_RECORD}Q"),
                                  ("value0", f"{TOKENS_PER_RECORD}I"), ("task_id", f"{TOKENS_PER_RECORD}H"),
                                  ("count", "H")]),
    RecordKind.MEMBERS_BATCH: (1, [("step_id", "Q"), ("request_id", f"{MEMBERS_PER_RECORD}Q"),
                                   ("num_tokens", f"{MEMBERS_PER_RECORD}I"), ("count", "H")]),
    # -- the HTTP server's records (infersight.serve), all on the engine's monotonic clock --------------
    RecordKind.NETWORK: (1, [("request_id", "Q"), ("receive_ns", "q"), ("first_byte_ns", "q"),
                             ("last_byte_ns", "q")]),
    RecordKind.SERVED: (1, [("request_id", "Q"), ("receive_ns", "q"), ("parent_span_id", "Q"),
                            ("temperature", "d"), ("top_p", "d"), ("top_k", "q"), ("seed", "q"),
                            ("max_tokens", "I"), ("operation", "B"), ("flags", "B")]),
    RecordKind.REQUEST_TEXT: (1, [("request_id", "Q"), ("offset", "I"), ("total", "I"), ("field", "B"),
                                  ("nbytes", "H"), ("data", f"{TEXT_CHUNK_BYTES}s")]),
    # -- expert-parallel ranks: dispatch/compute/combine/gather/total ns of one MoE layer on one rank;
    # bytes_to_peer: activation bytes dispatched to each rank; expert_ids/tokens: per local expert slot
    RecordKind.EP_STATS: (1, [("step_id", "Q"), ("layer", "H"), ("rank", "H"), ("world", "H"), ("chunk", "H"),
                              ("n_slots", "H"), ("dispatch_ns", "q"), ("combine_ns", "q"), ("compute_ns", "q"),
                              ("gather_ns", "q"), ("total_ns", "q"), ("bytes_to_peer", f"{EP_PEERS_PER_RECORD}Q"),
                              ("expert_ids", f"{EP_EXPERTS_PER_RECORD}H"),
                              ("expert_tokens", f"{EP_EXPERTS_PER_RECORD}I")]),
    # -- a GPU of the producing process: its index among the GPUs it sees and its UUID as NVML and
    # dcgm-exporter spell it (the sidecar keeps the node's GPU series of these UUIDs only)
    RecordKind.GPU: (1, [("ts_ns", "q"), ("index", "H"), ("uuid", f"{GPU_UUID_BYTES}s")]),
    # -- the engine's name (ENGINE_NAME_BYTES of printable ASCII, NUL-padded)
    RecordKind.ENGINE: (1, [("ts_ns", "q"), ("name", f"{ENGINE_NAME_BYTES}s")]),
    # -- a garbage collection that stalled the producing process: ts_ns..end_ns on its monotonic clock,
    # the objects it freed, its generation (0-2), and how many pauses before it were not kept (missed:
    # the engine took none for HOST_PAUSES_HELD collections, e.g. while idle)
    RecordKind.HOST_PAUSE: (1, [("ts_ns", "q"), ("end_ns", "q"), ("collected", "Q"), ("missed", "I"),
                                ("generation", "B")]),
}

_NUMPY_CODES = {"q": "<i8", "Q": "<u8", "I": "<u4", "H": "<u2", "B": "u1", "d": "<f8"}


def _numpy_format(code: str) -> object:
    if code.endswith("s"):
        return f"S{code[:-1]}"
    if len(code) > 1:
        return (_NUMPY_CODES[code[-1]], int(code[:-1]))
    return _NUMPY_CODES[code]


def record_struct(kind: RecordKind) -> RecordStruct:
    """Packed little-endian layout, identical byte for byte to record_dtype(kind); its ``pack``
    coerces (and counts) values out of a field's range instead of raising (record_encoding)."""
    return RecordStruct(RecordKind(kind).name, _LAYOUTS[kind][1])


def record_dtype(kind: RecordKind) -> np.dtype:
    fields = _LAYOUTS[kind][1]
    return np.dtype([(name, _numpy_format(code)) for name, code in fields])


def batched_kinds() -> BatchedKinds:
    """TOKENS_BATCH and MEMBERS_BATCH, and the per-record kinds they read as (probes.record_batches)."""
    return BatchedKinds(int(RecordKind.REQUEST), int(RecordKind.BATCH_MEMBER), int(RecordKind.TOKENS_BATCH),
                        int(RecordKind.MEMBERS_BATCH), record_dtype(RecordKind.REQUEST),
                        record_dtype(RecordKind.BATCH_MEMBER), int(RequestEvent.TOKENS), TOKENS_PER_RECORD,
                        MEMBERS_PER_RECORD)


def record_registry() -> RecordRegistry:
    """Every probe record type, for creating or attaching to a ring; a consumer attached with it
    reads the batched kinds as the per-record ones (probes.record_batches)."""
    return RecordRegistry((RecordType(int(kind), kind.name.lower(), version, record_dtype(kind))
                           for kind, (version, _) in _LAYOUTS.items()), batched_kinds().expand)


def valid_engine_name(name: str) -> bool:
    """An engine name a producer may be given: 1 to ENGINE_NAME_BYTES printable ASCII characters, no spaces."""
    return 0 < len(name) <= ENGINE_NAME_BYTES and all(" " < c <= "~" for c in name)


def engine_name_bytes(name: str) -> bytes:
    """An ENGINE record's name field: printable ASCII (anything else becomes "_"), at most
    ENGINE_NAME_BYTES bytes."""
    return "".join(c if " " <= c <= "~" else "_" for c in name)[:ENGINE_NAME_BYTES].encode("ascii")


def engine_name_of(raw: bytes) -> str:
    """The name an ENGINE record's field carries, the way a reader must take it (a producer's bytes
    are not trusted: NUL padding dropped, non-printable bytes as "_", at most ENGINE_NAME_BYTES)."""
    text = bytes(raw[:ENGINE_NAME_BYTES]).rstrip(b"\0").decode("ascii", "replace")
    return "".join(c if " " <= c <= "~" else "_" for c in text).strip()


def split_trace_id(trace_id: int) -> tuple[int, int]:
    return (trace_id >> 64) & 0xFFFF_FFFF_FFFF_FFFF, trace_id & 0xFFFF_FFFF_FFFF_FFFF


def join_trace_id(hi: int, lo: int) -> int:
    return (int(hi) << 64) | int(lo)
