"""The join of an engine's own request spans (received over OTLP) with the agent's finished rows.

An engine such as vLLM sends one childless span per request; the agent has the same request's
row (the decomposition, token counts, task) from the probe records its plugin wrote. They meet
here, by request key (the row's request id below the ring bits, RING_SHIFT), whichever comes
first waiting for the other at most `wait_s`:

    receiver threads ── add_spans ──> inbox ──┐   (other spans: forwarded unchanged at once)
    TracingHook.process ── add_row ───────────┼──> match by key ──> export_row(row, span): one tree
                                              └──> timed out: span alone -> forwarded as received
                                                              row alone  -> export_row(row, None)

Who owns the request span: while a receiver is on, every finished row waits for its engine span,
so the agent never exports two request spans for one request; a row whose span never comes
(another engine, sampling upstream, a lost export) is exported as the agent's own spans after
`wait_s`, and counted. The joined request span keeps the engine's trace id, span id and parent,
so the caller's trace stays whole; it gets our name, children and attributes (hook.py builds it
with spans.request_trace, the same code as for our engine, then `adopt` and `enrich` apply).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol

from opentelemetry.sdk.trace import ReadableSpan

from infersight.tracing.bounded import Evictions, record_bytes
from infersight.tracing.buffers import RING_SHIFT
from infersight.tracing.export_queue import span_bytes
from infersight.tracing.spans import RequestEvents, RequestTrace, ServedInfo

log = logging.getLogger("infersight.tracing")
KEY_MASK = (1 << RING_SHIFT) - 1
DEFAULT_WAIT_S = 10.0  # vLLM's batch span processor sends every 5 s by default
MAX_PENDING = 50_000
DEFAULT_MAX_BYTES = 32 << 20


@dataclass(frozen=True)
class EngineRequestSpan:
    """A received span that is an engine's request span: its join key (as the engine's plugin
    records request ids), GenAI operation and sampling parameters (ServedInfo.params names)."""

    span: ReadableSpan
    key: int
    operation: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def span_id(self) -> int:
        return self.span.context.span_id  # type: ignore[union-attr]


#: A received span -> its request span reading, or None when it is not a request span.
RequestSpanReader = Callable[[ReadableSpan], "EngineRequestSpan | None"]
Row = dict[str, Any]


class ExportRow(Protocol):
    def __call__(self, row: Row, events: RequestEvents, ring: int, engine: EngineRequestSpan | None) -> None: ...


@dataclass
class JoinCounts:
    """Request spans joined with a row; spans and rows that waited in vain (unjoined, by side)."""

    joined: int = 0
    span_alone: int = 0
    row_alone: int = 0
    forwarded: int = 0  # spans that are not request spans, forwarded as received


class SpanJoin:
    """Matches engine request spans with rows. add_spans may run on any thread; add_row and
    process run on the agent's ingest thread (where the hook's buffers live)."""

    def __init__(self, forward: Callable[[ReadableSpan], None], export_row: ExportRow, reader: RequestSpanReader,
                 wait_s: float = DEFAULT_WAIT_S, clock: Callable[[], float] = time.monotonic,
                 max_pending: int = MAX_PENDING, max_bytes: int = DEFAULT_MAX_BYTES,
                 evictions: Evictions | None = None) -> None:
        """max_pending, max_bytes: the waiting rows' and spans' bounds (entries each; estimated bytes,
        half each); beyond them the oldest goes on unjoined at once, counted in `evictions`."""
        self.forward, self.export_row, self.reader = forward, export_row, reader
        self.wait_s, self.clock, self.max_pending = wait_s, clock, max_pending
        self.max_side_bytes = max(1, max_bytes // 2)
        self.evictions = evictions if evictions is not None else Evictions()
        self.counts = JoinCounts()
        self._row_bytes: dict[int, int] = {}
        self._span_bytes: dict[int, int] = {}
        self.pending_bytes = [0, 0]  # spans, rows (the inbox is bounded by what the receiver accepts)
        self._lock = threading.Lock()  # guards the inbox only
        self._inbox: list[tuple[EngineRequestSpan, float]] = []
        self._spans: OrderedDict[int, tuple[EngineRequestSpan, float]] = OrderedDict()
        self._rows: OrderedDict[int, tuple[Row, RequestEvents, int, float]] = OrderedDict()

    # -- input --------------------------------------------------------------------------------------
    def add_spans(self, spans: list[ReadableSpan]) -> None:
        """From a receiver: request spans wait for their row; every other span goes on as it came."""
        now, waiting = self.clock(), []
        for span in spans:
            engine = self.reader(span)
            if engine is None:
                self.forward(span)
                self.counts.forwarded += 1
            else:
                waiting.append((engine, now))
        if waiting:
            with self._lock:
                self._inbox.extend(waiting)

    def add_row(self, row: Row, events: RequestEvents, ring: int) -> None:
        """A finished row, ready to export: joined now if its span is here, else it waits."""
        key = int(row["request_id"]) & KEY_MASK
        self._drain()
        found = self._pop_span(key)
        if found is not None:
            self._joined(row, events, ring, found[0])
            return
        old = self._pop_row(key)
        if old is not None:  # the same key twice (an id reused): the older row goes alone
            self._row_alone(*old[:3])
        self._rows[key] = (row, events, ring, self.clock())
        self._row_bytes[key] = size = record_bytes(row) + events.estimated_bytes()
        self.pending_bytes[1] += size
        while len(self._rows) > 1 and (len(self._rows) > self.max_pending
                                       or self.pending_bytes[1] > self.max_side_bytes):
            self.evictions.add("join_rows", "entries" if len(self._rows) > self.max_pending else "bytes")
            self._row_alone(*self._pop_row(next(iter(self._rows)))[:3])  # an OrderedDict: O(1)

    # -- matching and timeouts ------------------------------------------------------------------------
    def process(self, force: bool = False) -> None:
        """Match what arrived, then let out what waited wait_s (force: everything, at shutdown)."""
        self._drain()
        now = self.clock()
        for key in [k for k, (*_, since) in self._rows.items() if force or now - since >= self.wait_s]:
            self._row_alone(*self._pop_row(key)[:3])
        for key in [k for k, (_, since) in self._spans.items() if force or now - since >= self.wait_s]:
            self._span_alone(self._pop_span(key)[0])

    def _pop_row(self, key: int) -> tuple[Row, RequestEvents, int, float] | None:
        found = self._rows.pop(key, None)
        if found is not None:
            self.pending_bytes[1] -= self._row_bytes.pop(key)
        return found

    def _pop_span(self, key: int) -> tuple[EngineRequestSpan, float] | None:
        found = self._spans.pop(key, None)
        if found is not None:
            self.pending_bytes[0] -= self._span_bytes.pop(key)
        return found

    def _drain(self) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, []
        for engine, since in inbox:
            found = self._pop_row(engine.key)
            if found is not None:
                self._joined(*found[:3], engine)
                continue
            old = self._pop_span(engine.key)
            if old is not None:
                self._span_alone(old[0])
            self._spans[engine.key] = (engine, since)
            self._span_bytes[engine.key] = size = span_bytes(engine.span)
            self.pending_bytes[0] += size
            while len(self._spans) > 1 and (len(self._spans) > self.max_pending
                                            or self.pending_bytes[0] > self.max_side_bytes):
                self.evictions.add("join_spans", "entries" if len(self._spans) > self.max_pending else "bytes")
                self._span_alone(self._pop_span(next(iter(self._spans)))[0])

    def _joined(self, row: Row, events: RequestEvents, ring: int, engine: EngineRequestSpan) -> None:
        self.counts.joined += 1
        self.export_row(row, events, ring, engine)

    def _row_alone(self, row: Row, events: RequestEvents, ring: int) -> None:
        self.counts.row_alone += 1
        self.export_row(row, events, ring, None)

    def _span_alone(self, engine: EngineRequestSpan) -> None:
        self.counts.span_alone += 1
        self.forward(engine.span)

    @property
    def pending(self) -> tuple[int, int]:
        """(spans, rows) waiting (the inbox counts as spans)."""
        with self._lock:
            inbox = len(self._inbox)
        return len(self._spans) + inbox, len(self._rows)


# -- the joined request span: the engine's ids, our tree -------------------------------------------------
def adopt(engine: EngineRequestSpan, row: Mapping[str, Any], served: ServedInfo | None) -> tuple[Row, ServedInfo]:
    """The row and served info to build the joined request span from: the engine span's trace id
    and parent (its sampler kept it, so it counts as sampled), the operation and parameters the
    server recorded, else the ones the engine span carries."""
    ctx, parent = engine.span.context, engine.span.parent
    assert ctx is not None
    base = served if served is not None else ServedInfo(engine.operation, params=dict(engine.params))
    texts = dict(base.texts)
    if ctx.trace_state and "tracestate" not in texts:
        texts["tracestate"] = ctx.trace_state.to_header()
    adopted = replace(base, params=base.params or dict(engine.params), texts=texts,
                      parent_span_id=parent.span_id if parent is not None else 0,
                      remote_parent=parent is not None, parent_sampled=True)
    return {**row, "trace_id": f"{ctx.trace_id:032x}"}, adopted


def _plain(value: Any) -> bool:
    """A value the SDK takes as a span attribute (str, bool, int, float, or a list of one of them)."""
    if isinstance(value, (str, bool, int, float)):
        return True
    return isinstance(value, (list, tuple)) and all(isinstance(v, (str, bool, int, float)) for v in value)


def enrich(engine: EngineRequestSpan, trace: RequestTrace) -> None:
    """Keep the engine span's own attributes (ours win where both say it) and cover its interval."""
    root, span = trace.root, engine.span
    theirs = {k: v for k, v in (span.attributes or {}).items() if _plain(v)}
    root.attributes = {**theirs, **root.attributes}
    if span.start_time:
        root.start_ns = min(root.start_ns, span.start_time)
    if span.end_time:
        root.end_ns = max(root.end_ns, span.end_time)
