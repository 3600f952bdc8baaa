"""The loop's decisions: each one a record (GET /api/v1/decisions, the report, MCP), a counter and a
gauge (/metrics, catalogue.autoapply) and, when tracing is on, a span event.

A change goes through stages, each its own Decision with the same change_id:

    proposed    -> canaried     -> kept
                                -> rolled_back
    (the advice)   (applied to      (the measured A/B, with its interval, says so; or the window
                   one arm)          ran out unconfirmed: rolled back)
"""
from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

import infersight.exporters.catalogue as C

STAGES = ("proposed", "canaried", "kept", "rolled_back")


@dataclass(frozen=True)
class Decision:
    """One stage of one change. knob: "speculation" | "max_num_seqs"; target: the task label, or
    "engine" for max_num_seqs; before / after: the setting the change is from and to; numbers: the
    advice or measurement behind it (each figure's basis said in it); policy_seq: the control block
    generation that carried it (0: nothing written)."""

    decision_id: int
    change_id: int
    stage: str
    knob: str
    target: str
    before: Any
    after: Any
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)
    policy_seq: int = 0
    wall_time: float = field(default_factory=time.time)


class DecisionLog:
    """The decisions so far (the last `maxlen`), thread-safe: the loop appends on the poll thread, the
    API reads on the HTTP thread. listeners: called with each new decision (the tracing span event)."""

    def __init__(self, maxlen: int = 1000) -> None:
        self._lock = threading.Lock()
        self._decisions: deque[Decision] = deque(maxlen=maxlen)
        self._counts: Counter[tuple[str, str]] = Counter()
        self._next_id = 1
        self.listeners: list[Callable[[Decision], None]] = []
        self.in_flight: dict[str, int] = {"speculation": 0, "max_num_seqs": 0}
        self.speculation: dict[str, bool] = {}  # task -> the policy in force (kept or canaried)
        self.max_num_seqs = 0

    def record(self, change_id: int, stage: str, knob: str, target: str, before: Any, after: Any, reason: str,
               numbers: dict[str, Any] | None = None, policy_seq: int = 0) -> Decision:
        assert stage in STAGES, stage
        with self._lock:
            decision = Decision(self._next_id, change_id, stage, knob, target, before, after, reason,
                                dict(numbers or {}), policy_seq)
            self._next_id += 1
            self._decisions.append(decision)
            self._counts[(knob, stage)] += 1
        for listener in self.listeners:
            listener(decision)
        return decision

    def __iter__(self) -> Iterator[Decision]:
        with self._lock:
            return iter(list(self._decisions))

    def document(self, limit: int = 100) -> dict[str, Any]:
        """GET /api/v1/decisions: the last `limit` decisions, newest last, and what is in force."""
        with self._lock:
            items = list(self._decisions)[-limit:] if limit else []
            return {"decisions": [asdict(d) for d in items], "counts": {f"{k}/{s}": n for (k, s), n in
                                                                         sorted(self._counts.items())},
                    "in_force": {"speculation": dict(self.speculation), "max_num_seqs": self.max_num_seqs},
                    "in_flight": dict(self.in_flight)}

    def collect(self) -> Iterator[Metric]:
        """The loop's families (catalogue.autoapply), built fresh at each scrape."""
        with self._lock:
            counts, in_flight = dict(self._counts), dict(self.in_flight)
            speculation, seqs = dict(self.speculation), self.max_num_seqs
        fam = CounterMetricFamily(C.AUTOAPPLY_DECISIONS.name, C.AUTOAPPLY_DECISIONS.help,
                                  labels=list(C.AUTOAPPLY_DECISIONS.labels))
        for knob in ("speculation", "max_num_seqs"):
            for stage in STAGES:
                fam.add_metric([knob, stage], counts.get((knob, stage), 0))
        yield fam
        flight = GaugeMetricFamily(C.AUTOAPPLY_IN_FLIGHT.name, C.AUTOAPPLY_IN_FLIGHT.help,
                                   labels=list(C.AUTOAPPLY_IN_FLIGHT.labels))
        for knob, n in sorted(in_flight.items()):
            flight.add_metric([knob], n)
        yield flight
        spec = GaugeMetricFamily(C.AUTOAPPLY_SPECULATION.name, C.AUTOAPPLY_SPECULATION.help,
                                 labels=list(C.AUTOAPPLY_SPECULATION.labels))
        for task, on in sorted(speculation.items()):
            spec.add_metric([task], int(on))
        yield spec
        yield GaugeMetricFamily(C.AUTOAPPLY_MAX_NUM_SEQS.name, C.AUTOAPPLY_MAX_NUM_SEQS.help, value=seqs)

    def set_in_force(self, speculation: dict[str, bool] | None = None, max_num_seqs: int | None = None,
                     in_flight: dict[str, int] | None = None) -> None:
        with self._lock:
            if speculation is not None:
                self.speculation = dict(speculation)
            if max_num_seqs is not None:
                self.max_num_seqs = max_num_seqs
            if in_flight is not None:
                self.in_flight.update(in_flight)
