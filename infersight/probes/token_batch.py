"""A step's TOKENS records, held back and written to the ring as one batch.

A decode step emits one TOKENS event per sequence; packing and writing each as its own record
cost about 1 us apiece, a third of a millisecond-scale budget at batch 32 on a busy host. Held
here and written with one vectorised ring.write_many, the records are byte for byte the ones the
per-event path writes, in the same ring order: the owner flushes before writing any other record
(so a FINISHED never overtakes its request's last TOKENS) and at the end of every step.
"""
from __future__ import annotations

import struct
from typing import Callable

import numpy as np

from infersight.probes.records import RecordKind, RequestEvent, record_dtype, record_struct
from infersight.probes.ring import RingProducer

_UNKNOWN = (0, 0, 0)
#: Batch sizes whose n-record struct is kept; more distinct sizes than this start the cache over.
_MAX_CACHED_SIZES = 256


class TokenBatch:
    """Pending (t_ns, request_id, num_tokens) emissions; `meta` maps a request id to its
    (trace hi, trace lo, task id); `one` writes a single TOKENS record the coercing way."""

    def __init__(self, ring: RingProducer, meta: dict[int, tuple[int, int, int]],
                 one: Callable[[int, int, int], None]) -> None:
        self.pending: list[tuple[int, int, int]] = []
        self._ring, self._meta, self._one = ring, meta, one
        self._dtype = record_dtype(RecordKind.REQUEST)
        fmt = record_struct(RecordKind.REQUEST).format  # byte for byte the dtype's layout
        self._order, self._body = fmt[0], fmt[1:]
        self._structs: dict[int, struct.Struct] = {}
        self._event = int(RequestEvent.TOKENS)

    def add(self, t_ns: int, request_id: int, num_tokens: int) -> None:
        """One emission (the hot path may bind `pending.append` instead: the list object never changes)."""
        self.pending.append((t_ns, request_id, num_tokens))

    def _struct(self, n: int) -> struct.Struct:
        st = self._structs.get(n)
        if st is None:
            if len(self._structs) >= _MAX_CACHED_SIZES:
                self._structs.clear()
            st = self._structs[n] = struct.Struct(self._order + self._body * n)
        return st

    def flush(self) -> None:
        if not self.pending:
            return
        pending = self.pending.copy()
        self.pending.clear()
        # One struct.pack for the whole batch: several times cheaper than numpy field assignment.
        get, event, values = self._meta.get, self._event, []
        extend = values.extend
        for t, rid, n in pending:
            hi, lo, task = get(rid, _UNKNOWN)
            extend((t, 0, rid, hi, lo, n, 0, task, event, 0))
        try:
            data = self._struct(len(pending)).pack(*values)
        except (struct.error, OverflowError, TypeError):  # a value out of range: record by record, coerced
            for t, rid, n in pending:
                self._one(rid, t, n)
            return
        self._ring.write_many(RecordKind.REQUEST, np.frombuffer(data, self._dtype))
