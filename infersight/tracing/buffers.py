"""What the tracing hook keeps between probe batches, per request and per step, until the request's
row is final and its spans are built.

A request's pieces arrive spread over several batches: its batch memberships with every step,
its speculative verifications and KV reloads while it runs, the server's records around it. They
are gathered here by request id and taken out (`take`) when its spans are built, sampled or not.
Everything is bounded, in entries and in estimated bytes (bounded.py): a request whose row never
comes (its FINISHED lost to ring drops) is forgotten oldest first, and only the last MAX_STEPS steps
(fewer when their bytes say so) are kept for step spans; each forgotten entry is counted.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from infersight.correlate.frames import EventFrames, join_texts
from infersight.tracing.bounded import TUPLE_ITEM, BoundedTable, Evictions, record_bytes
from infersight.tracing.spans import RequestEvents, ServedInfo

MAX_STEPS = 20_000
MAX_REQUESTS = 50_000
DEFAULT_MAX_BYTES = 32 << 20
#: Request ids carry their ring's index above this bit (agent.rings.ingest.RING_ID_SHIFT).
RING_SHIFT = 48
#: Each table's share of the byte limit (steps and memberships are the big ones at steady load).
SHARES = {"steps": 0.2, "members": 0.2, "spec": 0.04, "reloads": 0.04, "served": 0.12, "network": 0.05,
          "texts": 0.2, "rows": 0.15}


class TraceBuffers:
    """The tables, each bounded in entries and in its share of max_bytes (estimated); what they
    forget is counted in `evictions` by table and reason."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, evictions: Evictions | None = None) -> None:
        self.evictions_counts = evictions if evictions is not None else Evictions()

        def table(name: str, entries: int) -> BoundedTable[Any, Any]:
            return BoundedTable(name, self.evictions_counts, entries, max(1, int(max_bytes * SHARES[name])))

        self.steps = table("steps", MAX_STEPS)              # step id -> STEP record
        self.step_end: dict[int, int] = {}                  # ring index -> latest step end (mono ns); one per ring
        self.members = table("members", MAX_REQUESTS)       # request id -> [(step id, tokens)]
        self.spec = table("spec", MAX_REQUESTS)             # request id -> [accepted, proposed]
        self.reloads = table("reloads", MAX_REQUESTS)       # request id -> KV reload times
        self.served = table("served", MAX_REQUESTS)         # request id -> SERVED record
        self.network = table("network", MAX_REQUESTS)       # request id -> (receive, first, last byte)
        self.texts = table("texts", MAX_REQUESTS)           # request id -> REQUEST_TEXT chunks
        # request id -> (finished row, its events, when added): rows waiting for their steps (hook.process)
        self.rows = table("rows", MAX_REQUESTS)

    def absorb(self, frames: EventFrames, ring_index: int) -> None:
        """Fold in one batch (request and step ids already shifted by ring, as the agent reads them)."""
        steps = frames.steps
        if not steps.empty:
            for rec in steps.to_dict("records"):
                self.steps.put(int(rec["step_id"]), rec, record_bytes(rec))
            self.step_end[ring_index] = max(self.step_end.get(ring_index, -1), int(steps["end_ns"].max()))
        b = frames.batch
        for rid, step, tokens in zip(b["request_id"].tolist(), b["step_id"].tolist(), b["num_tokens"].tolist()):
            self.members.append(rid, (step, tokens), TUPLE_ITEM)
        sp = frames.spec
        for rid, acc, prop in zip(sp["request_id"].tolist(), sp["accepted"].tolist(), sp["proposed"].tolist()):
            totals = self.spec.get(rid) or [0, 0]
            totals[0] += acc
            totals[1] += prop
            self.spec.put(rid, totals, TUPLE_ITEM)
        kv = frames.kv_events
        rel = kv[(kv["event"] == "reloaded") & (kv["request_id"] >= 0)]
        for rid, ts in zip(rel["request_id"].tolist(), rel["ts_ns"].tolist()):
            self.reloads.append(rid, ts, 40)
        for rec in frames.served.to_dict("records"):
            self.served.put(int(rec["request_id"]), rec, record_bytes(rec))
        net = frames.network
        for rid, r, f, e in zip(net["request_id"].tolist(), net["receive_ns"].tolist(),
                                net["first_byte_ns"].tolist(), net["last_byte_ns"].tolist()):
            self.network.put(rid, (r, f, e), TUPLE_ITEM)
        tx = frames.texts
        for row in tx.itertuples(index=False):
            chunk = tuple(row)
            self.texts.append(int(row.request_id), chunk, TUPLE_ITEM + sum(
                len(v) if isinstance(v, (str, bytes)) else 8 for v in chunk))

    def add_row(self, row: dict[str, Any], events: RequestEvents, added: float) -> None:
        """A finished row (and its events) waiting for its steps; the oldest beyond the rows table's
        limits is forgotten (counted), and so are its pieces in the other tables."""
        rid = int(row["request_id"])
        self.rows.put(rid, (row, events, added), record_bytes(row) + events.estimated_bytes())
        for gone in self.rows.evicted():
            self.forget(gone)

    def forget(self, request_id: int) -> None:
        """Drop a request's pieces without building anything (its row was evicted)."""
        for table in (self.spec, self.reloads, self.members, self.served, self.network, self.texts):
            table.pop(request_id)

    def evictions(self) -> dict[str, int]:
        """Entries forgotten so far, as "table/reason" -> count."""
        return {f"{t}/{r}": n for (t, r), n in sorted(self.evictions_counts.snapshot().items())}

    def step(self, step_id: int) -> dict[str, int] | None:
        return self.steps.get(step_id)

    def take(self, request_id: int) -> tuple[ServedInfo | None, tuple[int, int], list[int], list[tuple[int, int]]]:
        """(served info or None, (accepted, proposed), KV reload times, (step id, tokens) in step order)
        of one request, removing them from the buffers."""
        accepted, proposed = self.spec.pop(request_id, (0, 0))
        reloads = self.reloads.pop(request_id, [])
        steps = sorted(self.members.pop(request_id, []))
        rec = self.served.pop(request_id, None)
        timing = self.network.pop(request_id, (-1, -1, -1))
        chunks = self.texts.pop(request_id, [])
        if rec is None:
            return None, (accepted, proposed), reloads, steps
        texts = {}
        if chunks:
            frame = pd.DataFrame(chunks, columns=list(EventFrames().texts.columns))
            texts = {name: text for (_, name), text in join_texts(frame).items()}
        receive = timing[0] if timing[0] >= 0 else int(rec["receive_ns"])
        params: dict[str, Any] = {
            "temperature": float(rec["temperature"]), "top_p": float(rec["top_p"]),
            "top_k": int(rec["top_k"]) if rec["top_k"] > 0 else None, "max_tokens": int(rec["max_tokens"]),
            "seed": int(rec["seed"]) if rec["seed"] >= 0 else None, "stream": bool(rec["stream"])}
        served = ServedInfo(str(rec["operation"]), receive, timing[1], timing[2], int(np.uint64(rec["parent_span_id"])),
                            bool(rec["remote_parent"]), bool(rec["parent_sampled"]),
                            bool(rec["traceparent_invalid"]), params, texts)
        return served, (accepted, proposed), reloads, steps
