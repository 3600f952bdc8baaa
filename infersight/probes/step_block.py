"""A step's records built as slot rows and written to the ring with one copy.

A batch-32 decode step writes 66 records (32 TOKENS, STEP, STEP_TIMING, 32 BATCH_MEMBER); one
`ring.write` each, or a numpy field assignment per field, cost 30-80 us a step. Here they are rows
of u64 words laid out as the ring's slots (header, record), so the ring takes them with one copy
(RingProducer.write_slots). The rows stay between steps, and a decode batch rarely changes, so a
step rewrites only what changed: the TOKENS timestamps, the members' step id and the STEP rows
(the ring sets every seq); a request's id, trace and task words come from a template made when it
arrived::

    staging row   base-n .. base-1   base   base+1        base+2 .. base+1+m
    record        TOKENS x n         STEP   STEP_TIMING   BATCH_MEMBER x m

The records are byte for byte those one `write` per record stores, in the same ring order (TOKENS
first: they were emitted before the step ended). `struct` checks each value as the per-record pack
does; a value that does not fit makes `write_tokens` / `write_step` return False before anything
reaches the ring, and the caller writes that batch record by record, coerced and counted
(probes.record_encoding). Only slot bytes past a record's itemsize, which no reader looks at, may
differ. Unchanged rows are recognised by equality with the last step's values, which were checked:
a value equal to one of them but of another type (1.0 for 1) is written as that int, uncounted.
"""
from __future__ import annotations

import struct
from operator import attrgetter
from typing import Callable

import numpy as np

from infersight.probes.record_encoding import PACK_ERRORS
from infersight.probes.records import RecordKind, RequestEvent, record_dtype, record_struct
from infersight.probes.ring import RingProducer
from infersight.probes.schema import SLOT_HEADER, SLOT_HEADER_SIZE
from infersight.runtime.stats import StepStats

#: Counts whose struct / views are kept; more distinct counts than this start the cache over.
_MAX_CACHED = 256
#: The STEP record's values but its last two (len(batch), len(finished)), and STEP_TIMING's, in field order.
step_values = attrgetter("step_id", "start_ns", "end_ns", "num_prefill_tokens", "num_decode_tokens",
                         "num_spec_tokens", "num_spec_accepted", "kv_blocks_in_use", "kv_blocks_cached",
                         "kv_blocks_total", "kv_block_size", "num_waiting", "num_running", "num_swapped",
                         "num_preempted")
timing_values = attrgetter("step_id", "start_ns", "end_ns", "schedule_ns", "draft_ns", "target_ns",
                           "num_decode_tokens", "num_prefill_tokens", "num_spec_tokens", "num_spec_accepted",
                           "draft_forwards", "spec_probe")


def _header_word(kind: RecordKind) -> int:
    """Word 1 of a slot (kind, reserved, length) as the ring's slot header packs it."""
    return int(np.frombuffer(SLOT_HEADER.pack(0, kind, 0, record_dtype(kind).itemsize), np.uint64)[1])


def _word(kind: RecordKind, field: str) -> int:
    """The slot word holding an 8-byte field of a record (the layout keeps them 8-aligned)."""
    offset = SLOT_HEADER_SIZE + record_dtype(kind).fields[field][1]
    assert offset % 8 == 0, f"{kind.name}.{field} is not 8-byte aligned in its slot"
    return offset // 8


class _Templates(dict):
    """request id -> its TOKENS row's words from 1 as bytes; an unknown id gets a fresh, unstored one."""

    def __init__(self, make: Callable[[int, int, int, int], bytes]) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, rid: int) -> bytes:
        return self.make(rid, 0, 0, 0)


class _Views:
    """Views of the staging rows of a block with n TOKENS and m members (m None: TOKENS alone)."""

    def __init__(self, stage: np.ndarray, base: int, n: int, m: int | None, block: "StepBlock") -> None:
        tokens = stage[base - n:base]
        self.block = tokens if m is None else stage[base - n:base + 2 + m]
        self.templates = tokens[:, 1:1 + block.template_words]
        self.ts, self.counts = tokens[:, block.w_ts], tokens[:, block.w_count]
        self.members = stage[base + 2:base + 2 + (m or 0)]
        self.ts_and_steps = self.block[:, block.w_ts]  # TOKENS ts, then the step id of STEP.. and members
        self.steps_after = 0 if m is None else 2 + m
        # That column's values are packed here by struct, then copied in by one numpy call.
        self.column = bytearray(8 * len(self.block))
        self.column_words = np.frombuffer(self.column, np.uint64)
        self.ts_bytes = 8 * n
        self.ints = struct.Struct(f"<{n}q")  # n TOKENS ts or counts, checked as the per-record pack checks


class StepBlock:
    """Pending TOKENS emissions and the staging rows of a step's records (see the module)."""

    def __init__(self, ring: RingProducer, rows: int = 64) -> None:
        self._ring = ring
        self._row_bytes = ring.header.slot_size  # a staging row is a whole slot
        #: Held TOKENS emissions, flat: t_ns, request_id, num_tokens, t_ns, ... in emission order.
        self.pending: list[int] = []
        req = record_struct(RecordKind.REQUEST)
        self._req_pack, self._tokens_event = req.fast_pack, int(RequestEvent.TOKENS)
        self.w_ts, self.w_count = _word(RecordKind.REQUEST, "ts_ns"), _word(RecordKind.REQUEST, "value0")
        self.template_words = -(-(SLOT_HEADER_SIZE + req.size) // 8) - 1
        self._req_header = struct.pack("<Q", _header_word(RecordKind.REQUEST))
        self._template_pad = bytes(8 * (self.template_words + 1) - SLOT_HEADER_SIZE - req.size)
        self.templates = _Templates(self._template)
        member = record_dtype(RecordKind.BATCH_MEMBER)
        assert [(f, member.fields[f][1]) for f in member.names] == [
            ("step_id", 0), ("request_id", 8), ("num_tokens", 16)], member
        self._member_header = _header_word(RecordKind.BATCH_MEMBER)
        self.w_member_step = _word(RecordKind.BATCH_MEMBER, "step_id")
        # The TOKENS ts and every other row's step id share a word: write_step sets them as one column.
        assert self.w_ts == self.w_member_step == _word(RecordKind.STEP, "step_id") == _word(
            RecordKind.STEP_TIMING, "step_id")
        self._step_rows, self._step_id = self._step_struct(), struct.Struct("<Q")
        self._step_header, self._timing_header = _header_word(RecordKind.STEP), _header_word(RecordKind.STEP_TIMING)
        self._structs: dict[str, struct.Struct] = {}
        self._generation = 0  # bumped when a template changes: TOKENS rows made before are stale
        self._alloc(rows)

    # -- staging ----------------------------------------------------------------------------------
    def _alloc(self, rows: int) -> None:
        """Room for `rows` TOKENS and `rows` members; what the rows held is forgotten."""
        self._rows = self._base = rows
        self._stage = np.zeros((2 * rows + 2, self._row_bytes // 8), np.uint64)
        self._step_offset = rows * self._row_bytes
        self._stage_bytes = memoryview(self._stage).cast("B")
        self._tokens_key: tuple[list[int], int] | None = None  # (request ids, generation) in the rows
        self._counts_key: list[int] | None = None
        self._members_key: list[tuple[int, int]] | None = None
        self._views: dict[tuple[int, int | None], _Views] = {}

    def _views_of(self, n: int, m: int | None) -> _Views:
        views = self._views.get((n, m))
        if views is None:
            if max(n, m or 0) > self._rows:
                self._alloc(max(n, m or 0, 2 * self._rows))
            if len(self._views) >= _MAX_CACHED:
                self._views.clear()
            views = self._views[(n, m)] = _Views(self._stage, self._base, n, m, self)
        return views

    def _struct(self, fmt: str) -> struct.Struct:
        st = self._structs.get(fmt)
        if st is None:
            if len(self._structs) >= _MAX_CACHED:
                self._structs.clear()
            st = self._structs[fmt] = struct.Struct(fmt)
        return st

    def _step_struct(self) -> struct.Struct:
        """STEP and STEP_TIMING as two rows: seq (the ring sets it), header word, record, padding."""
        fmt = "<"
        for kind in (RecordKind.STEP, RecordKind.STEP_TIMING):
            rec = record_struct(kind)
            fmt += f"8xQ{rec.format[1:]}{self._row_bytes - SLOT_HEADER_SIZE - rec.size}x"
        return struct.Struct(fmt)

    # -- per-request templates --------------------------------------------------------------------
    def _template(self, rid: int, trace_hi: int, trace_lo: int, task_id: int) -> bytes:
        """A TOKENS row's words from 1 with ts and count 0 (raises PACK_ERRORS for a bad id)."""
        record = self._req_pack(0, 0, rid, trace_hi, trace_lo, 0, 0, task_id, self._tokens_event, 0)
        return self._req_header + record + self._template_pad

    def add_request(self, rid: int, trace_hi: int, trace_lo: int, task_id: int) -> None:
        """A request's identity, for its TOKENS rows (an id that does not fit is left to the coercing path)."""
        try:
            self.templates[rid] = self._template(rid, trace_hi, trace_lo, task_id)
        except PACK_ERRORS:
            self.templates.pop(rid, None)
        self._generation += 1

    def drop_request(self, rid: int) -> None:
        if self.templates.pop(rid, None) is not None:
            self._generation += 1

    # -- writing ----------------------------------------------------------------------------------
    def take_pending(self) -> list[tuple[int, int, int]]:
        """The held emissions as (t_ns, request_id, num_tokens), no longer held (the coercing path's)."""
        flat = iter(self.pending.copy())
        self.pending.clear()
        return list(zip(flat, flat, flat))

    def _fill_tokens(self, views: _Views, step_id: bytes = b"") -> None:
        """The held TOKENS into their rows, and `step_id` (packed u64) into the word of the rows
        after them that holds the step id; raises PACK_ERRORS for a value that does not fit."""
        pending = self.pending
        n = len(views.ts)
        rids = pending[1::3]
        key = (rids, self._generation)
        if key != self._tokens_key:
            self._tokens_key = self._counts_key = None  # the rows are being rewritten
            self._struct(f"<{n}Q").pack(*rids)  # struct's check of the ids, as the per-record pack's
            blob = b"".join(map(self.templates.__getitem__, rids))
            views.templates[:] = np.frombuffer(blob, np.uint64).reshape(n, self.template_words)
            self._tokens_key = key
        ints = views.ints
        # One column write for the step: numpy's cost is per call, hardly per row.
        ints.pack_into(views.column, 0, *pending[0::3])
        views.column[views.ts_bytes:] = step_id * views.steps_after
        views.ts_and_steps[:] = views.column_words
        counts = pending[2::3]
        if counts != self._counts_key:
            self._counts_key = None
            views.counts[:] = np.frombuffer(ints.pack(*counts), np.uint64)
            self._counts_key = counts

    def _fill_members(self, batch: list[tuple[int, int]], views: _Views) -> None:
        """The BATCH_MEMBER rows but their step id; raises PACK_ERRORS for a value that does not fit."""
        self._members_key = None
        m = len(batch)
        packed = self._struct("<" + "QI4x" * m).pack(*[v for pair in batch for v in pair])
        w = self.w_member_step
        views.members[:, w + 1:w + 3] = np.frombuffer(packed, np.uint64).reshape(m, 2)
        views.members[:, 1] = self._member_header
        self._members_key = list(batch)

    def write_tokens(self) -> bool:
        """Write the held TOKENS (none: nothing to do). False: a value does not fit and nothing was
        written; they are still held, for the coercing path (take_pending)."""
        if not self.pending:
            return True
        views = self._views_of(len(self.pending) // 3, None)
        try:
            self._fill_tokens(views)
        except PACK_ERRORS:
            return False
        self.pending.clear()
        self._ring.write_slots(views.block)
        return True

    def write_step(self, stats: StepStats) -> bool:
        """Write the held TOKENS, STEP, STEP_TIMING and one BATCH_MEMBER per batch entry, as one run
        of slots. False: a value does not fit and nothing was written (the TOKENS still held)."""
        batch = stats.batch
        shape = (len(self.pending) // 3, len(batch))
        views = self._views.get(shape) or self._views_of(*shape)
        try:
            self._step_rows.pack_into(self._stage_bytes, self._step_offset,
                                      self._step_header, *step_values(stats), len(batch), len(stats.finished),
                                      self._timing_header, *timing_values(stats))
            if batch and batch != self._members_key:  # a decode batch mostly is the last step's
                self._fill_members(batch, views)
            step_id = self._step_id.pack(stats.step_id)  # the pack above checked it
            if self.pending:
                self._fill_tokens(views, step_id)
            elif batch:
                views.column[:] = step_id * views.steps_after
                views.ts_and_steps[:] = views.column_words
        except PACK_ERRORS:
            return False
        self.pending.clear()
        self._ring.write_slots(views.block)
        return True
