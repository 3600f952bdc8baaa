"""vLLM's KV cache event wire format (vllm/distributed/kv_events.py), decoded with explicit bounds.

The publisher sends one ZeroMQ multipart message per engine step that changed the prefix cache:

    frame 0  topic     the publisher's `topic`, utf-8 (vLLM's default is empty)
    frame 1  sequence  8 bytes, big-endian, unsigned: 0, 1, 2, ... per publisher process
    frame 2  payload   msgpack array [ts, [event, ...], data_parallel_rank]
                       ts: wall-clock seconds (time.time() in vLLM's scheduler)

Each event is a msgpack map tagged by "type" (msgspec `tag=True`; the events are not array_like):

    {"type": "BlockStored", "block_hashes": [h, ...], "parent_block_hash": h | nil, "token_ids": [...],
     "block_size": n, "lora_id": ..., "medium": "GPU", "lora_name": ..., "group_idx": n, ...}
    {"type": "BlockRemoved", "block_hashes": [h, ...], "medium": "GPU", "group_idx": n, ...}
    {"type": "AllBlocksCleared"}

A hash h is bytes (sha256, vLLM's default) or an int (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES). Fields
at their default are omitted (omit_defaults); fields not named here are skipped, because vLLM adds
fields between releases. Replay (a ROUTER at the replay endpoint): a DEALER sends
[b"", start_seq as 8 bytes big-endian] and receives [b"", topic, seq, payload] for every batch still
buffered with seq >= start_seq, then the end marker [b"", b"", -1 as 8 signed bytes, b""].

Bounds are checked before anything is allocated for them: frame count, topic, sequence width and
payload size here, list lengths in the schema (msgspec checks a length before decoding elements).
Nesting is bounded by the schema where it is typed (a value of the wrong kind fails at its first byte,
however deep it goes on); where it is not (an unknown field, an event held raw), msgspec skips the
value by recursion, within the interpreter's recursion limit: past it, the RecursionError it raises
is the message's drop (Malformed "payload"), like every other exception from decoding one message.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Union

import msgspec

#: Per-batch and per-event list bounds (a step of a very large engine stays far below them).
MAX_EVENTS_PER_BATCH = 1 << 17
MAX_HASHES_PER_EVENT = 1 << 17
MAX_HASH_BYTES = 64
MAX_SESSION_ID_CHARS = 256
SEQ_BYTES = 8
#: |ts| bound (wall seconds, about year 2096): ts * 1e9 must stay an int64 of ns (1e300 used to
#: raise OverflowError in the subscriber's poll).
MAX_TS_S = 4e9
END_SEQ = (-1).to_bytes(SEQ_BYTES, "big", signed=True)
HASH_MASK = (1 << 64) - 1
#: Why a message (or one event in it) was dropped: the `reason` label of the malformed counter.
MALFORMED_REASONS = ("frame_count", "topic", "sequence", "too_large", "payload", "unknown_event", "event_fields")

BlockHash = Union[int, Annotated[bytes, msgspec.Meta(max_length=MAX_HASH_BYTES)]]
BlockHashes = Annotated[list[BlockHash], msgspec.Meta(max_length=MAX_HASHES_PER_EVENT)]
#: A KV cache group index: vLLM has a handful (one per attention type); the ledger keys 16 bits of it.
GroupIdx = Annotated[int, msgspec.Meta(ge=0, lt=1 << 16)]


class _Event(msgspec.Struct, tag=True):
    """The base of vLLM's tagged KV events (the tag is the class name, under "type")."""


class BlockStored(_Event):
    """Blocks whose content was hashed into the prefix cache (full blocks, in chain order)."""

    block_hashes: BlockHashes
    parent_block_hash: BlockHash | None = None
    block_size: int | None = None
    medium: str | None = None
    group_idx: GroupIdx | None = None
    session_id: Annotated[str, msgspec.Meta(max_length=MAX_SESSION_ID_CHARS)] | None = None


class BlockRemoved(_Event):
    """Hashes dropped from the prefix cache (the block was reused for other content)."""

    block_hashes: BlockHashes
    medium: str | None = None
    group_idx: GroupIdx | None = None


class AllBlocksCleared(_Event):
    """The whole prefix cache was reset."""


KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]
EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: Annotated[list[msgspec.Raw], msgspec.Meta(max_length=MAX_EVENTS_PER_BATCH)]
    data_parallel_rank: Annotated[int, msgspec.Meta(ge=0, lt=1 << 16)] | None = None


class _Tag(msgspec.Struct):
    type: str


_BATCH = msgspec.msgpack.Decoder(_Batch)
_EVENT = msgspec.msgpack.Decoder(KVEvent)
_TAG = msgspec.msgpack.Decoder(_Tag)


class Malformed(ValueError):
    """A message dropped whole; reason is one of MALFORMED_REASONS. seq: its sequence number when
    that was readable (the stream's order then survives the drop), else None."""

    def __init__(self, reason: str, detail: str, seq: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.seq = seq


@dataclass
class KVBatch:
    """One decoded message. dropped: events skipped inside it, by reason (unknown_event,
    event_fields); errors: the first error of each of those reasons, for the log line."""

    seq: int
    ts: float
    dp_rank: int
    events: list[KVEvent]
    dropped: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def hash64(block_hash: BlockHash) -> int:
    """A vLLM block hash as the uint64 our kv_events frame carries: the low 64 bits of the
    big-endian value, which is how vLLM itself turns a bytes hash into an int hash."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash, "big") & HASH_MASK
    return block_hash & HASH_MASK


def parse_seq(frame: bytes) -> int:
    if len(frame) != SEQ_BYTES:
        raise Malformed("sequence", f"sequence frame of {len(frame)} bytes, expected {SEQ_BYTES}")
    return int.from_bytes(frame, "big")


def check_frames(parts: list[bytes], topic: bytes, max_payload_bytes: int) -> int:
    """Frame count, topic, sequence width and payload size of a published message; its sequence."""
    if len(parts) != 3:
        raise Malformed("frame_count", f"{len(parts)} frames, expected 3 (topic, sequence, payload)")
    if parts[0] != topic:
        raise Malformed("topic", f"topic {parts[0][:32]!r}, expected {topic!r}")
    seq = parse_seq(parts[1])
    if len(parts[2]) > max_payload_bytes:
        raise Malformed("too_large", f"payload of {len(parts[2])} bytes, limit {max_payload_bytes}", seq)
    return seq


def decode_payload(seq: int, payload: bytes) -> KVBatch:
    """The batch in a payload. A payload that is not a batch raises Malformed("payload"); an
    event that does not decode is skipped and counted in the batch's `dropped`."""
    try:
        raw = _BATCH.decode(payload)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
        raise Malformed("payload", str(exc)[:160], seq) from None
    except Exception as exc:  # noqa: BLE001 -- RecursionError (nested past the limit), or a decoder bug
        raise Malformed("payload", f"{type(exc).__name__}: {str(exc)[:120]}", seq) from None
    if not (math.isfinite(raw.ts) and abs(raw.ts) <= MAX_TS_S):  # rows carry ts as int64 ns
        raise Malformed("payload", f"timestamp {raw.ts!r}", seq)
    batch = KVBatch(seq, raw.ts, raw.data_parallel_rank or 0, [])
    for item in raw.events:
        try:
            batch.events.append(_EVENT.decode(item))
        except Exception as exc:  # noqa: BLE001 -- DecodeError; RecursionError or a bug: the event's drop too
            reason = "event_fields"
            try:
                if _TAG.decode(item).type not in EVENT_TYPES:
                    reason = "unknown_event"
            except Exception:  # noqa: BLE001,S110 -- no readable tag: counted as event_fields
                pass
            batch.dropped[reason] = batch.dropped.get(reason, 0) + 1
            detail = str(exc) if isinstance(exc, msgspec.DecodeError) else f"{type(exc).__name__}: {exc}"
            batch.errors.setdefault(reason, detail[:160])
    return batch


def decode_message(parts: list[bytes], topic: bytes, max_payload_bytes: int) -> KVBatch:
    """A published multipart message (topic, sequence, payload) -> its batch, or Malformed."""
    seq = check_frames(parts, topic, max_payload_bytes)
    return decode_payload(seq, parts[2])


def is_replay_end(parts: list[bytes]) -> bool:
    """The replay's end marker, after the DEALER's empty delimiter frame: [b"", END_SEQ, b""]."""
    return len(parts) == 3 and parts[0] == b"" and parts[1] == END_SEQ
