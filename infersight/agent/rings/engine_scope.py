"""EngineScope: the `engine` label of the engine families when one agent reads several engines' rings.

The folds count into the state's counters and histograms as they always did, through views: with
the label off the views are the state's own dicts (nothing changes, to the byte); with it on, an
engine family's view appends the engine in scope to every label tuple, after the family's own labels
(catalogue.identity.engine_labelled says which families; the agent-wide ones are left as they are):

    fold: counters[REQUESTS].inc(("chat", "stop"), 3)
    view: state.counters[REQUESTS].values[("chat", "stop", "engine-a")] += 3

AgentState sets the scope per ring batch (the ring's engine: the name its ENGINE record announced,
else the ring's name). Rows released later, by a batch of another ring or by GPU readings, are
counted under THEIR engine: a request id carries its ring's index above RING_ID_SHIFT (agent.rings.ingest),
and `split` groups ids by the engine of that ring. Readers that want the old totals sum over the
engine with `merged`.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np
import pandas as pd

from infersight.agent.rings.ingest import RING_ID_SHIFT
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import Labels, LabelledCounter, LabelledHistogram
from infersight.exporters.catalogue.identity import engine_labelled

#: The engine of what no ring brought (vLLM's KV events over ZMQ): no engine announced it.
UNATTRIBUTED = "unattributed"
#: The names of the families that carry the label when it is on.
ENGINE_FAMILIES = frozenset(spec.name for spec in C.CATALOGUE if engine_labelled(spec))


@dataclass(frozen=True)
class RingEngine:
    """A batch's source: the ring's index (its ids are shifted by index << RING_ID_SHIFT), its name, and
    the engine it belongs to (agent.rings.ingest.AttachedRing.engine)."""

    index: int
    ring: str
    engine: str


@dataclass(frozen=True)
class EngineView:
    """One engine's share of what the gauges read (exporters.prometheus.EngineSlice)."""

    last_step: dict[str, int]
    expert_tokens: np.ndarray
    spec_events: pd.DataFrame
    spec_step_timing: pd.DataFrame


class EngineScope:
    """on: whether the label is on. current: the engine folds count for now. names: ring index ->
    engine name (a ring's, as the scope last heard it)."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.current = UNATTRIBUTED
        self.names: dict[int, str] = {}
        self.seen: set[str] = set()

    # -- views --------------------------------------------------------------------------------
    def counters(self, raw: dict[str, LabelledCounter]) -> dict[str, LabelledCounter]:
        if not self.on:
            return raw
        return {name: ScopedCounter(c, self) if name in ENGINE_FAMILIES else c for name, c in raw.items()}

    def histograms(self, raw: dict[str, LabelledHistogram]) -> dict[str, LabelledHistogram]:
        if not self.on:
            return raw
        return {name: ScopedHistogram(h, self) if name in ENGINE_FAMILIES else h for name, h in raw.items()}

    # -- which engine -------------------------------------------------------------------------------
    def enter(self, engine: str | None, ring_index: int | None = None) -> bool:
        """Count for `engine` from now on (None: UNATTRIBUTED), the engine of ring `ring_index` when
        given; True the first time this engine is entered (its zero series are due)."""
        name = engine if engine is not None else UNATTRIBUTED
        self.current = name
        if ring_index is not None:
            self.names[ring_index] = name
        new = name not in self.seen
        self.seen.add(name)
        return new

    @contextmanager
    def within(self, engine: str | None) -> Iterator[None]:
        """Count for `engine` inside the block (None: leave the scope as it is)."""
        before = self.current
        if engine is not None:
            self.current = engine
        try:
            yield
        finally:
            self.current = before

    def engines_of(self, ids: np.ndarray) -> np.ndarray:
        """The engine of each request or step id (object array), from its ring index."""
        index = np.asarray(ids, dtype=np.int64) >> RING_ID_SHIFT
        rings, at = np.unique(index, return_inverse=True)  # a lookup per ring, not per id (windows of 10^5 rows)
        names = np.array([self.names.get(int(i), UNATTRIBUTED) for i in rings.tolist()] or [UNATTRIBUTED], dtype=object)
        return names[at.reshape(-1)] if len(index) else np.empty(0, dtype=object)

    def split(self, ids: np.ndarray) -> list[tuple[str | None, np.ndarray]]:
        """ids grouped by engine, each group's ids in their order: one group (None, ids) with the
        label off, so that nothing about the unlabelled path changes."""
        if not self.on or len(ids) == 0:
            return [(None, ids)]
        engines = self.engines_of(ids)
        return [(str(name), ids[engines == name]) for name in sorted(set(engines.tolist()))]


class ScopedCounter:
    """A LabelledCounter's view that appends the scope's engine to the labels it is given."""

    def __init__(self, base: LabelledCounter, scope: EngineScope) -> None:
        self.base, self.scope = base, scope

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        self.base.inc((*labels, self.scope.current), amount)


class ScopedHistogram:
    """A LabelledHistogram's view that appends the scope's engine to the labels it is given."""

    def __init__(self, base: LabelledHistogram, scope: EngineScope) -> None:
        self.base, self.scope = base, scope

    def observe(self, labels: Labels, values: np.ndarray | list[float],
                exemplar_trace_ids: list[str] | None = None, wall_time: float = 0.0) -> None:
        self.base.observe((*labels, self.scope.current), values, exemplar_trace_ids, wall_time)


def merged(counter: LabelledCounter, on: bool) -> LabelledCounter:
    """The counter summed over the engine (its last label) when the label is on; itself when off."""
    if not on:
        return counter
    out = LabelledCounter()
    for labels, value in counter.values.items():
        out.inc(labels[:-1], value)
    return out


def by_engine(counter: LabelledCounter) -> Mapping[str, float]:
    """A labelled counter's total per engine (its last label)."""
    totals: dict[str, float] = {}
    for labels, value in counter.values.items():
        totals[labels[-1]] = totals.get(labels[-1], 0.0) + value
    return totals
