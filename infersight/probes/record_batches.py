"""Batched records read as the per-record ones: TOKENS_BATCH -> REQUEST, MEMBERS_BATCH -> BATCH_MEMBER.

A batch-32 decode step emits 32 TOKENS events and 32 batch members. One slot each, they were 64 of
the step's 66 slots (19 KB a step to build, copy and read). The observer writes them many to a slot
instead (probes.step_block): 7 of the step's 9 slots::

    TOKENS_BATCH   ts_ns[7] request_id[7] trace_hi[7] trace_lo[7] value0[7] (u32) task_id[7] count
    MEMBERS_BATCH  step_id  request_id[21] num_tokens[21] count

Entry i of a record is element i of each array field, for i < count. A reader never sees these
kinds: `BatchedKinds.expand` (the probe registry's, applied by RingConsumer.read) turns each entry
back into the record the per-record path writes for it (REQUEST with event TOKENS, end_ns / value1 / reason 0;
BATCH_MEMBER), in ring order among the REQUEST and BATCH_MEMBER records of the same read (the
per-record path still writes those kinds: other request events, and a step holding a value that
does not fit its field). So every frame, fold and metric is what the per-record layout gave.

A ring event is a slot: a dropped or corrupt batched slot counts once, for all its entries. A slot
whose count exceeds its record's capacity is refused and counted corrupt.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Sort keys: a slot's position times this, plus the entry's index (< the width): ring order.
_WIDTH = 32


@dataclass(frozen=True)
class BatchedKinds:
    """The kind ids, dtypes and widths `expand` needs (probes.records builds the one instance;
    this module imports nothing from there, so the two do not import each other)."""

    request: int
    member: int
    tokens_batch: int
    members_batch: int
    request_dtype: np.dtype
    member_dtype: np.dtype
    tokens_event: int
    tokens_per_record: int
    members_per_record: int

    def __post_init__(self) -> None:
        assert self.tokens_per_record < _WIDTH and self.members_per_record < _WIDTH

    def expand(self, records: dict[int, np.ndarray], positions: dict[int, np.ndarray]
               ) -> tuple[dict[int, np.ndarray], int]:
        """One read's records with the batched kinds unbatched (see the module), and the slots refused."""
        if self.tokens_batch not in records and self.members_batch not in records:
            return records, 0
        out = dict(records)
        refused = 0
        for batched, plain, unbatch in ((self.tokens_batch, self.request, self._tokens),
                                        (self.members_batch, self.member, self._members)):
            rec = out.pop(batched, None)
            if rec is None:
                continue
            rows, used, bad = unbatch(rec)
            refused += bad
            if plain in out and len(out[plain]):  # ring order among both: each entry's key is needed
                out[plain] = _merge(out[plain], positions[plain], rows, _keys(positions[batched], used))
            elif len(rows) or plain in out:
                out[plain] = rows
        return out, refused

    def _tokens(self, rec: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """(the entries as REQUEST records, the mask of entries in use, the records refused)."""
        used, valid = _entries(rec, self.tokens_per_record)
        out = np.zeros(int(used.sum()), self.request_dtype)
        for name in ("ts_ns", "request_id", "trace_hi", "trace_lo", "value0", "task_id"):
            out[name] = rec[name][used]
        out["event"] = self.tokens_event
        return out, used, int(len(rec) - valid.sum())

    def _members(self, rec: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """(the entries as BATCH_MEMBER records, the mask of entries in use, the records refused)."""
        used, valid = _entries(rec, self.members_per_record)
        out = np.empty(int(used.sum()), self.member_dtype)
        out["step_id"] = np.repeat(rec["step_id"], used.sum(axis=1))  # each record's entries are its first ones
        out["request_id"], out["num_tokens"] = rec["request_id"][used], rec["num_tokens"][used]
        return out, used, int(len(rec) - valid.sum())


def _entries(rec: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(mask over (record, entry) of the entries in use, mask of the records whose count is valid)."""
    count = rec["count"].astype(np.int64)
    valid = count <= width
    return (np.arange(width) < np.where(valid, count, 0)[:, None]), valid


def _keys(pos: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Each used entry's sort key: its slot's position, then its index in the record."""
    return (pos.astype(np.int64)[:, None] * _WIDTH + np.arange(used.shape[1]))[used]


def _merge(plain: np.ndarray, plain_pos: np.ndarray, unbatched: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The per-record kind's records and the unbatched ones, in ring order (both already are): each
    plain record goes after the unbatched rows with a smaller key (a search, not a sort), the rows
    moved as opaque bytes (numpy copies a structured item field by field)."""
    at = np.arange(len(plain)) + np.searchsorted(keys, plain_pos.astype(np.int64) * _WIDTH)
    out = np.empty(len(plain) + len(unbatched), plain.dtype)
    raw = np.dtype((np.void, plain.dtype.itemsize))
    others = np.ones(len(out), bool)
    others[at] = False
    out_raw = out.view(raw)
    out_raw[at] = plain.view(raw)
    out_raw[others] = unbatched.view(raw)
    return out
