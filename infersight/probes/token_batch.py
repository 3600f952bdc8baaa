"""A step's TOKENS records, held back and written to the ring as one batch.

A decode step emits one TOKENS event per sequence; packing and writing each as its own record
cost about 1 us apiece, a third of a millisecond-scale budget at batch 32 on a busy host. Held
here and written with one vectorised ring.write_many, the records are byte for byte the ones the
per-event path writes, in the same ring order: the owner flushes before writing any other record
(so a FINISHED never overtakes its request's last TOKENS) and at the end of every step.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from infersight.probes.records import RecordKind, RequestEvent, record_dtype
from infersight.probes.ring import RingProducer

_UNKNOWN = (0, 0, 0)


class TokenBatch:
    """Pending (t_ns, request_id, num_tokens) emissions; `meta` maps a request id to its
    (trace hi, trace lo, task id); `one` writes a single TOKENS record the coercing way."""

    def __init__(self, ring: RingProducer, meta: dict[int, tuple[int, int, int]],
                 one: Callable[[int, int, int], None]) -> None:
        self.pending: list[tuple[int, int, int]] = []
        self._ring, self._meta, self._one = ring, meta, one
        self._dtype = record_dtype(RecordKind.REQUEST)

    def add(self, t_ns: int, request_id: int, num_tokens: int) -> None:
        """One emission (the hot path may bind `pending.append` instead: the list object never changes)."""
        self.pending.append((t_ns, request_id, num_tokens))

    def flush(self) -> None:
        if not self.pending:
            return
        pending = self.pending.copy()
        self.pending.clear()
        ts, rids, counts = zip(*pending)
        get = self._meta.get
        hi, lo, task = zip(*[get(r, _UNKNOWN) for r in rids])
        recs = np.zeros(len(pending), self._dtype)
        try:
            recs["ts_ns"], recs["request_id"], recs["value0"] = ts, rids, counts
            recs["trace_hi"], recs["trace_lo"], recs["task_id"] = hi, lo, task
        except (OverflowError, ValueError, TypeError):  # a value out of range: record by record, coerced
            for t, rid, n in pending:
                self._one(rid, t, n)
            return
        recs["event"] = RequestEvent.TOKENS
        self._ring.write_many(RecordKind.REQUEST, recs)
