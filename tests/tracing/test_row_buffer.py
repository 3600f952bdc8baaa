"""The tracing hook's finished rows waiting for their steps are bounded in bytes (and entries): at a
high request rate, or while their steps do not come, the oldest are forgotten and counted
(infersight_tracing_buffer_evicted_total{buffer="rows"}), and so are their other pieces. A burst
of rows that are ready in the poll they arrive in is built whole, never evicted.
The memory bound is checked with tracemalloc (what Python really holds), not with the buffer's
own estimate; the eviction count against the rows fed in here."""
from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pandas as pd
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from infersight.tracing.buffers import SHARES, TraceBuffers
from infersight.tracing.exporter import SpanPipeline
from infersight.tracing import hook as hook_module
from infersight.tracing.hook import TracingHook

MAX_BYTES = 4 << 20
N = 4000


def rows_and_events(start: int, n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rid = np.arange(start, start + n)
    rows = pd.DataFrame({"request_id": rid, "finish_ns": rid * 1000 + 10**12, "task": ["code"] * n,
                         "slow_cause": ["none"] * n})
    events = pd.DataFrame({"request_id": np.repeat(rid, 10), "ts_ns": np.arange(10 * n), "event": ["token"] * (10 * n)})
    return rows, events


def test_waiting_rows_are_capped_in_bytes_and_evictions_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hook_module, "STEP_WAIT_S", 1e9)  # on a slow machine the test passes 1 s: still waiting
    hook = TracingHook(SpanPipeline.build(InMemorySpanExporter(), batch=False), "m", buffers=TraceBuffers(MAX_BYTES))
    hook.buffers.served.put(0, {"request_id": 0}, 100)  # a piece of the first row: forgotten with it
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for start in range(0, N, 100):  # 4,000 rows and 40,000 events, polled 100 at a time; their steps
            hook.add_rows(*rows_and_events(start, 100))  # never come, and they never time out
            hook.process()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    kept = len(hook.buffers.rows)
    share = SHARES["rows"] * MAX_BYTES
    assert held < 2 * share + (512 << 10), held  # unbounded, the 4,000 rows held ~18 MB
    assert 0 < kept < N
    assert list(hook.buffers.rows) == list(range(N - kept, N))  # the newest stay, in order
    assert hook.buffers.evictions() == {"rows/bytes": N - kept}
    assert 0 not in hook.buffers.served
    reg = CollectorRegistry()
    reg.register(hook.collector())
    assert reg.get_sample_value("infersight_tracing_buffer_evicted_total",
                                {"buffer": "rows", "reason": "bytes"}) == N - kept


def test_a_burst_of_ready_rows_is_built_whole() -> None:
    memory = InMemorySpanExporter()
    hook = TracingHook(SpanPipeline.build(memory, batch=False), "m", buffers=TraceBuffers(1 << 16))
    rows, events = rows_and_events(0, 500)  # far over the rows table's ~10 KB share
    hook.buffers.step_end[0] = int(rows["finish_ns"].max())  # their steps are all in
    built: list[int] = []
    hook.export_row = lambda row, events, ring, engine=None: built.append(int(row["request_id"]))  # type: ignore
    hook.add_rows(rows, events)
    hook.process()
    assert hook.buffers.evictions() == {} and len(hook.buffers.rows) == 0
    assert built == list(range(500))


def test_rows_still_build_and_close_counts_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hook_module, "STEP_WAIT_S", 1e9)
    memory = InMemorySpanExporter()
    hook = TracingHook(SpanPipeline.build(memory, batch=False), "m", buffers=TraceBuffers(MAX_BYTES))
    hook.add_rows(*rows_and_events(0, 2))
    hook.process()  # not ready (no steps, no time-out): kept waiting
    hook.add_rows(*rows_and_events(2, 1))  # arrived after the last poll
    assert len(hook.buffers.rows) == 2
    hook.build_deadline = 0.0  # past: nothing more is built
    assert hook.close(0.5) == 0
    assert hook.rows_unsent == 3 and len(hook.buffers.rows) == 0
