"""A step's records built as slot rows and written to the ring with one copy.

A batch-32 decode step emits 32 TOKENS events, STEP, STEP_TIMING and 32 batch members. The TOKENS
go out 7 to a TOKENS_BATCH record and the members 21 to a MEMBERS_BATCH record
(probes.record_batches): 9 slots, where one record a slot took 66. The slots are rows of u64 words
laid out as the ring's (header, record), so the ring takes them with one copy
(RingProducer.write_slots). The rows stay between steps, and a decode batch rarely changes, so a
step rewrites only what changed: every row's seq (numbered from the ring's next_seq, packed with
the row's other words where there are some), the TOKENS timestamps, the members' step id and the
STEP rows; the ids, traces and tasks of the TOKENS rows are rewritten when the emitting requests
(or any request's identity) change::

    staging row   base-s .. base-1             base   base+1        base+2 .. base+1+k
    record        TOKENS_BATCH x s=ceil(n/7)   STEP   STEP_TIMING   MEMBERS_BATCH x k=ceil(m/21)

Read back (record_batches.expand) they are the records one `write` per record stores, in the same
ring order (TOKENS first: they were emitted before the step ended). `struct` checks each value as
the per-record pack does; a value that does not fit makes `write_tokens` / `write_step` return
False before anything reaches the ring, and the caller writes that batch record by record in the
per-record kinds, coerced and counted (probes.record_encoding). Unchanged rows are recognised by
equality with the last step's values, which were checked: a value equal to one of them but of
another type (1.0 for 1) is written as that int, uncounted.
"""
from __future__ import annotations

import struct
from operator import attrgetter

import numpy as np

from infersight.probes.record_encoding import PACK_ERRORS
from infersight.probes.records import (
    MEMBERS_PER_RECORD, TOKENS_PER_RECORD, RecordKind, record_dtype, record_struct,
)
from infersight.probes.ring import RingProducer
from infersight.probes.schema import SLOT_HEADER, SLOT_HEADER_SIZE
from infersight.runtime.stats import StepStats

#: Counts whose views are kept; more distinct (TOKENS, members) counts than this start the cache over.
_MAX_CACHED = 256
#: The STEP record's values but its last two (len(batch), len(finished)), and STEP_TIMING's, in field order.
step_values = attrgetter("step_id", "start_ns", "end_ns", "num_prefill_tokens", "num_decode_tokens",
                         "num_spec_tokens", "num_spec_accepted", "kv_blocks_in_use", "kv_blocks_cached",
                         "kv_blocks_total", "kv_block_size", "num_waiting", "num_running", "num_swapped",
                         "num_preempted")
timing_values = attrgetter("step_id", "start_ns", "end_ns", "schedule_ns", "draft_ns", "target_ns",
                           "num_decode_tokens", "num_prefill_tokens", "num_spec_tokens", "num_spec_accepted",
                           "draft_forwards", "spec_probe", "graph_captures", "profiled", "kv_moves",
                           "launched_ahead", "launched_next")
_TOKENS, _MEMBERS = RecordKind.TOKENS_BATCH, RecordKind.MEMBERS_BATCH
_UNSIGNED = {8: np.uint64, 4: np.uint32, 2: np.uint16}
_CODES = {("i", 8): "q", ("u", 8): "Q", ("u", 4): "I", ("u", 2): "H"}
_NO_IDENTITY = (0, 0, 0)  # trace hi, trace lo, task of a request that never arrived
_I64_MIN, _I64_MAX, _U64_MASK = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


def _header_word(kind: RecordKind) -> int:
    """Word 1 of a slot (kind, reserved, length) as the ring's slot header packs it."""
    return int(np.frombuffer(SLOT_HEADER.pack(0, kind, 0, record_dtype(kind).itemsize), np.uint64)[1])


class _Column:
    """One field of `n` entries laid over staging rows, `width` entries a row (the field's array
    length; 1 for a scalar): filled by one struct pack (which checks the values) and one numpy copy.
    Entries past `n` stay zero: the pack never touches them."""

    def __init__(self, rows: np.ndarray, kind: RecordKind, field: str, n: int) -> None:
        sub, offset = record_dtype(kind).fields[field][:2]
        width, base = (sub.shape[0], sub.base) if sub.shape else (1, sub)
        start = SLOT_HEADER_SIZE + offset
        assert start % base.itemsize == 0, f"{kind.name}.{field} is not aligned in its slot"
        lo = start // base.itemsize
        self.view = rows.view(_UNSIGNED[base.itemsize])[:, lo:lo + width]
        self.buf = bytearray(len(rows) * width * base.itemsize)
        self.src = np.frombuffer(self.buf, _UNSIGNED[base.itemsize]).reshape(len(rows), width)
        self.pack_into = struct.Struct(f"<{n}{_CODES[(base.kind, base.itemsize)]}").pack_into

    def fill(self, values: list[int]) -> None:
        self.pack_into(self.buf, 0, *values)
        self.view[:] = self.src


class _Views:
    """The staging rows of a block with n TOKENS and m members (m None: TOKENS alone), and their columns."""

    def __init__(self, stage: np.ndarray, base: int, n: int, m: int | None) -> None:
        s, k = -(-n // TOKENS_PER_RECORD), -(-(m or 0) // MEMBERS_PER_RECORD)
        self.block = stage[base - s:base] if m is None else stage[base - s:base + 2 + k]
        self.tokens, self.members = stage[base - s:base], stage[base + 2:base + 2 + k]
        if n:
            col = lambda field, count=n: _Column(self.tokens, _TOKENS, field, count)  # noqa: E731
            self.ts, self.value0 = col("ts_ns"), col("value0")
            self.ids = [col("request_id"), col("trace_hi"), col("trace_lo"), col("task_id")]
            self.tokens_count = col("count", s)
            self.tokens_counts = [min(TOKENS_PER_RECORD, n - TOKENS_PER_RECORD * i) for i in range(s)]
            # One timestamp for all n entries (a held batch): the full rows, then the last row's first
            # entries; the padding past n stays zero.
            self.ts_fills = [rows.fill for rows in
                             (self.ts.view[:-1], self.ts.view[-1, :n - TOKENS_PER_RECORD * (s - 1)]) if len(rows)]
        if k:
            assert m is not None
            self.member_ids = _Column(self.members, _MEMBERS, "request_id", m)
            self.member_tokens = _Column(self.members, _MEMBERS, "num_tokens", m)
            self.members_count = _Column(self.members, _MEMBERS, "count", k)
            self.members_counts = [min(MEMBERS_PER_RECORD, m - MEMBERS_PER_RECORD * i) for i in range(k)]
        self.n, self.m, self.s = n, m, s
        # Where each row's seq goes, set every step: the TOKENS rows' words, the members' byte offsets
        # (their seq, header and step id are packed together: the step id is the record's first field).
        words = stage.shape[1]
        self.tokens_seqs = [(base - s + i) * words for i in range(s)]
        self.member_rows = [(base + 2 + i) * words * 8 for i in range(k)]


class StepBlock:
    """Pending TOKENS emissions and the staging rows of a step's records (see the module)."""

    def __init__(self, ring: RingProducer, rows: int = 64) -> None:
        self._ring = ring
        self._row_bytes = ring.header.slot_size  # a staging row is a whole slot
        #: Held TOKENS emissions, flat: t_ns, request_id, num_tokens, t_ns, ... in emission order.
        self.pending: list[int] = []
        #: Or a held batch at one timestamp (hold): its request ids and token counts, `pending` empty.
        #: The lists are the caller's, never changed here (they are replaced, not cleared).
        self.held_ids: list[int] = []
        self.held_counts: list[int] = []
        self.held_ns = 0
        #: request id -> (trace hi, trace lo, task id) of the requests that arrived and are not finished.
        self.identities: dict[int, tuple[int, int, int]] = {}
        assert record_dtype(_MEMBERS).fields["step_id"][1] == 0
        self._tokens_header, self._members_header = _header_word(_TOKENS), _header_word(_MEMBERS)
        self._step_rows, self._member_row = self._step_struct(), struct.Struct("<QQQ")  # seq, header, step id
        self._step_header, self._timing_header = _header_word(RecordKind.STEP), _header_word(RecordKind.STEP_TIMING)
        self._generation = 0  # bumped when an identity changes: TOKENS rows made before are stale
        self._alloc(rows)

    # -- staging ----------------------------------------------------------------------------------
    def _alloc(self, entries: int) -> None:
        """Room for `entries` TOKENS and `entries` members; what the rows held is forgotten."""
        self._entries = entries
        self._base = s = -(-entries // TOKENS_PER_RECORD)
        self._stage = np.zeros((s + 2 + -(-entries // MEMBERS_PER_RECORD), self._row_bytes // 8), np.uint64)
        self._step_offset = s * self._row_bytes
        self._stage_bytes = memoryview(self._stage).cast("B")
        self._stage_words = self._stage_bytes.cast("Q")
        self._tokens_rids: list[int] | None = None  # the request ids in the TOKENS rows, and their generation
        self._tokens_generation = -1
        self._counts_key: list[int] | None = None
        self._members_key: list[tuple[int, int]] | None = None
        self._views: dict[tuple[int, int | None], _Views] = {}
        self._last = self._views_of(0, 0)  # the last step's views

    def _views_of(self, n: int, m: int | None) -> _Views:
        views = self._views.get((n, m))
        if views is None:
            if max(n, m or 0) > self._entries:
                self._alloc(max(n, m or 0, 2 * self._entries))
            if len(self._views) >= _MAX_CACHED:
                self._views.clear()
            views = self._views[(n, m)] = _Views(self._stage, self._base, n, m)
        return views

    def _step_struct(self) -> struct.Struct:
        """STEP and STEP_TIMING as two rows: seq, header word, record, padding."""
        fmt = "<"
        for kind in (RecordKind.STEP, RecordKind.STEP_TIMING):
            rec = record_struct(kind)
            fmt += f"QQ{rec.format[1:]}{self._row_bytes - SLOT_HEADER_SIZE - rec.size}x"
        return struct.Struct(fmt)

    # -- per-request identities -------------------------------------------------------------------
    def add_request(self, rid: int, trace_hi: int, trace_lo: int, task_id: int) -> None:
        """A request's identity, for its TOKENS entries (a value that does not fit is caught when written)."""
        self.identities[rid] = (trace_hi, trace_lo, task_id)
        self._generation += 1

    def drop_request(self, rid: int) -> None:
        if self.identities.pop(rid, None) is not None:
            self._generation += 1

    # -- writing ----------------------------------------------------------------------------------
    def hold(self, t_ns: int, request_ids: list[int], num_tokens: list[int]) -> None:
        """Emissions of one timestamp, held as they are (no per-entry work); behind other held ones,
        all are held flat."""
        behind = bool(self.pending or self.held_ids)
        self.flatten()
        self.held_ns, self.held_ids, self.held_counts = t_ns, request_ids, num_tokens
        if behind:
            self.flatten()

    def flatten(self) -> None:
        """A held batch into `pending`'s flat form, where single emissions can follow it."""
        if self.held_ids:
            t = self.held_ns
            self.pending.extend(x for rid, n in zip(self.held_ids, self.held_counts) for x in (t, rid, n))
            self.held_ids, self.held_counts = [], []

    @property
    def held(self) -> int:
        """How many emissions are held."""
        return len(self.held_ids) or len(self.pending) // 3

    def _release(self) -> None:
        self.pending.clear()
        self.held_ids, self.held_counts = [], []

    def take_pending(self) -> list[tuple[int, int, int]]:
        """The held emissions as (t_ns, request_id, num_tokens), no longer held (the coercing path's)."""
        self.flatten()
        flat = iter(self.pending.copy())
        self.pending.clear()
        return list(zip(flat, flat, flat))

    def _fill_ids(self, rids: list[int], views: _Views) -> None:
        """The TOKENS rows' ids, traces, tasks, counts and headers; raises PACK_ERRORS for a value that does not fit."""
        identity = self.identities.get
        his, los, tasks = zip(*[identity(rid, _NO_IDENTITY) for rid in rids])
        for column, values in zip(views.ids, (rids, his, los, tasks)):
            column.fill(values)
        views.tokens_count.fill(views.tokens_counts)
        views.tokens[:, 1] = self._tokens_header

    def _fill_tokens(self, views: _Views, seq: int) -> None:
        """The held TOKENS into their rows, numbered from `seq`; raises PACK_ERRORS for a value that does not fit."""
        pending = self.pending
        held = not pending
        rids = self.held_ids if held else pending[1::3]
        if rids != self._tokens_rids or self._generation != self._tokens_generation:
            self._tokens_rids = self._counts_key = None  # the rows are being rewritten
            self._fill_ids(rids, views)
            self._tokens_rids, self._tokens_generation = rids, self._generation
        if held:  # one timestamp: checked here as the pack would ("q"), then a fill per run of entries
            t = self.held_ns
            if type(t) is not int or not _I64_MIN <= t <= _I64_MAX:
                raise struct.error(f"TOKENS ts_ns {t!r} does not fit an i64")
            t &= _U64_MASK
            for fill in views.ts_fills:
                fill(t)
        else:
            ts = views.ts  # Column.fill inlined: the one column written every step
            ts.pack_into(ts.buf, 0, *pending[0::3])
            ts.view[:] = ts.src
        words = self._stage_words
        for word in views.tokens_seqs:
            words[word] = seq
            seq += 1
        counts = self.held_counts if held else pending[2::3]
        if counts != self._counts_key:
            self._counts_key = None
            views.value0.fill(counts)
            self._counts_key = counts

    def _fill_members(self, batch: list[tuple[int, int]], views: _Views) -> None:
        """The MEMBERS_BATCH rows but their seq, header and step id; raises PACK_ERRORS for a value
        that does not fit."""
        self._members_key = None
        views.member_ids.fill([rid for rid, _ in batch])
        views.member_tokens.fill([tokens for _, tokens in batch])
        views.members_count.fill(views.members_counts)
        self._members_key = list(batch)

    def write_tokens(self) -> bool:
        """Write the held TOKENS (none: nothing to do). False: a value does not fit and nothing was
        written; they are still held, for the coercing path (take_pending)."""
        n = self.held
        if not n:
            return True
        views = self._views_of(n, None)
        try:
            self._fill_tokens(views, self._ring.next_seq)
        except PACK_ERRORS:
            return False
        self._release()
        self._ring.write_slots(views.block)
        return True

    def write_step(self, stats: StepStats) -> bool:
        """Write the held TOKENS, STEP, STEP_TIMING and the batch's members, as one run of slots.
        False: a value does not fit and nothing was written (the TOKENS still held)."""
        batch = stats.batch
        n, m = self.held, len(batch)
        views = self._last
        if views.n != n or views.m != m:  # a decode batch mostly has the last step's shape
            views = self._last = self._views_of(n, m)
        first = self._ring.next_seq
        seq = first + views.s  # STEP's: the TOKENS rows come first
        try:
            self._step_rows.pack_into(self._stage_bytes, self._step_offset, seq, self._step_header,
                                      *step_values(stats), len(batch), len(stats.finished),
                                      seq + 1, self._timing_header, *timing_values(stats))
            if batch:
                if batch != self._members_key:  # a decode batch mostly is the last step's
                    self._fill_members(batch, views)
                pack, stage, header = self._member_row.pack_into, self._stage_bytes, self._members_header
                for offset in views.member_rows:  # the pack above checked the step id
                    seq += 1
                    pack(stage, offset, seq + 1, header, stats.step_id)
            if n:
                self._fill_tokens(views, first)
        except PACK_ERRORS:
            return False
        self._release()
        self._ring.write_slots(views.block)
        return True
