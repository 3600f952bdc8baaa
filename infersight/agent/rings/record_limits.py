"""The agent's own limits on what a producer sends: records are screened before they are decoded.

A ring's producer is outside the agent's trust: a record whose fields would make an analysis
allocate without bound (an MoE layer 65535), index out of range, or mean nothing (an event code
no engine writes) is taken out of the batch here, before `EventFrames.from_records`, and counted
by reason (`infersight_probe_records_rejected_total{ring, reason}`). Task labels are capped by the
agent, across all its rings, whatever cap the producer applied: a label beyond `max_task_labels`
distinct names is refused and its task id reads as "other" (counted with reason
``task_label_over_limit``). Every check is one vectorised comparison per field: no per-record Python.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from infersight.agent.rings.limits_config import RecordLimits  # noqa: F401  (re-exported: its old home)
from infersight.exporters.catalogue import HOST_PAUSE_GENERATIONS
from infersight.probes.records import (
    EP_EXPERTS_PER_RECORD, EP_PEERS_PER_RECORD, TEXT_CHUNK_BYTES, RecordKind, RequestEvent, TextField,
)
from infersight.runtime.observer import KVBlockEvent

log = logging.getLogger("infersight.agent")

#: Reasons a record is refused (the metric's `reason` label values: a closed set).
MOE_LAYER = "moe_layer_over_limit"
MOE_EXPERTS = "moe_experts_over_limit"
MOE_OFFSET = "moe_offset_out_of_range"
REQUEST_EVENT = "request_event_unknown"
KV_EVENT = "kv_event_unknown"
TEXT_CHUNK = "text_chunk_out_of_range"
SPEC_COUNTS = "spec_accepted_over_proposed"
EP_RANK = "ep_rank_out_of_range"
TASK_LABEL_ID = "task_label_id_zero"
TASK_LABEL_LIMIT = "task_label_over_limit"
TOKENS_COUNT = "request_tokens_out_of_range"
HOST_PAUSE = "host_pause_out_of_range"
REASONS = (MOE_LAYER, MOE_EXPERTS, MOE_OFFSET, REQUEST_EVENT, KV_EVENT, TEXT_CHUNK, SPEC_COUNTS, EP_RANK,
           TASK_LABEL_ID, TASK_LABEL_LIMIT, TOKENS_COUNT, HOST_PAUSE)

def _known(codes: list[int]) -> np.ndarray:
    """A table over every u8 code: True for these. One take per record (an isin compares each
    record with every known code)."""
    table = np.zeros(256, bool)
    table[codes] = True
    return table


#: REQUEST and KV_BLOCK event fields are u8 (probes.records): every value indexes the table.
_REQUEST_EVENTS = _known([int(e) for e in RequestEvent])
_KV_EVENTS = _known([int(e) for e in KVBlockEvent])
_TEXT_FIELDS = np.array(sorted(int(f) for f in TextField))


@dataclass
class TaskLabelBook:
    """The distinct task names the agent accepted, shared by every ring (the series they make are)."""

    limit: int
    names: set[str] = field(default_factory=set)

    def admit(self, name: str) -> bool:
        if name in self.names or name == "other":
            return True
        if len(self.names) >= self.limit:
            return False
        self.names.add(name)
        return True


def _bad_masks(kind: int, rec: np.ndarray, limits: RecordLimits) -> list[tuple[str, np.ndarray]]:
    """(reason, mask of refused records) for one kind's batch; the first reason that applies counts."""
    if kind == RecordKind.MOE:
        n_experts = rec["n_experts"]
        return [(MOE_LAYER, rec["layer"] >= limits.max_moe_layers),
                (MOE_EXPERTS, n_experts > limits.max_moe_experts),
                (MOE_OFFSET, rec["expert_offset"] >= n_experts)]
    if kind == RecordKind.REQUEST:
        event, tokens = rec["event"], rec["value0"]
        return [(REQUEST_EVENT, ~_REQUEST_EVENTS[event]),
                (TOKENS_COUNT, (event == RequestEvent.TOKENS)
                 & ((tokens < 0) | (tokens > limits.max_tokens_per_event)))]
    if kind == RecordKind.KV_BLOCK:
        return [(KV_EVENT, ~_KV_EVENTS[rec["event"]])]
    if kind == RecordKind.REQUEST_TEXT:
        nbytes, offset, total = (rec[c].astype(np.int64) for c in ("nbytes", "offset", "total"))
        return [(TEXT_CHUNK, ~np.isin(rec["field"], _TEXT_FIELDS) | (nbytes > TEXT_CHUNK_BYTES)
                 | (offset + nbytes > total))]
    if kind == RecordKind.SPEC:
        return [(SPEC_COUNTS, rec["accepted"] > rec["proposed"])]
    if kind == RecordKind.EP_STATS:
        world, chunk = rec["world"].astype(np.int64), rec["chunk"].astype(np.int64)
        too_far = (chunk * EP_PEERS_PER_RECORD >= np.maximum(world, 1)) & (
            chunk * EP_EXPERTS_PER_RECORD >= np.maximum(rec["n_slots"].astype(np.int64), 1))
        return [(EP_RANK, (world == 0) | (rec["rank"] >= world) | too_far)]
    if kind == RecordKind.HOST_PAUSE:
        # A pause that ends before it starts, of a generation Python does not have, or freeing more
        # objects than an int64 holds.
        return [(HOST_PAUSE, (rec["end_ns"] < rec["ts_ns"]) | (rec["generation"] >= len(HOST_PAUSE_GENERATIONS))
                 | (rec["collected"] >= np.uint64(1 << 63)))]
    return []


class RecordScreen:
    """Screens each batch a ring yields (see the module docstring); counts what it refuses.

    ``take_rejected`` hands over the counts since the last call: {(ring, reason): records}.
    """

    def __init__(self, limits: RecordLimits, log_interval_s: float = 10.0) -> None:
        self.limits = limits
        self.labels = TaskLabelBook(limits.max_task_labels)
        self.rejected: Counter[tuple[str, str]] = Counter()
        self._pending: Counter[tuple[str, str]] = Counter()
        self._log_interval_s = log_interval_s
        self._next_log: dict[str, float] = {}

    def screen(self, ring: str, records: dict[int, np.ndarray], labels: dict[int, str]
               ) -> tuple[dict[int, np.ndarray], dict[int, str]]:
        """The records the agent accepts, and the ring's labels with the admitted TASK_LABELs."""
        out: dict[int, np.ndarray] = {}
        counts: Counter[str] = Counter()
        for kind, rec in records.items():
            if kind == RecordKind.TASK_LABEL:
                labels = self._labels(rec, labels, counts)
                continue
            bad = None
            for reason, mask in _bad_masks(kind, rec, self.limits):
                mask = mask if bad is None else mask & ~bad
                n = int(np.count_nonzero(mask))
                if n:
                    counts[reason] += n
                    bad = mask if bad is None else bad | mask
            out[kind] = rec if bad is None else rec[~bad]
        if counts:
            self._count(ring, counts)
        return out, labels

    def _labels(self, rec: np.ndarray, labels: dict[int, str], counts: Counter[str]) -> dict[int, str]:
        out = {0: "other", **labels}
        for task_id, raw in zip(rec["task_id"].tolist(), rec["label"].tolist()):  # one per new label: rare
            name = bytes(raw).rstrip(b"\0").decode("utf-8", "replace")
            if task_id == 0:
                counts[TASK_LABEL_ID] += 1
            elif self.labels.admit(name):
                out[task_id] = name
            else:
                counts[TASK_LABEL_LIMIT] += 1
                out.pop(task_id, None)  # a re-announced id over the limit reads "other" too
        return out

    def _count(self, ring: str, counts: Counter[str]) -> None:
        for reason, n in counts.items():
            self.rejected[(ring, reason)] += n
            self._pending[(ring, reason)] += n
        now = time.monotonic()
        if now >= self._next_log.get(ring, 0.0):
            self._next_log[ring] = now + self._log_interval_s
            total = {r: n for (name, r), n in self.rejected.items() if name == ring}
            log.warning("ring %r: probe records refused (%s so far; logged at most every %.0f s)", ring,
                        ", ".join(f"{r} {n}" for r, n in sorted(total.items())), self._log_interval_s)

    def take_rejected(self) -> dict[tuple[str, str], int]:
        pending, self._pending = dict(self._pending), Counter()
        return pending
