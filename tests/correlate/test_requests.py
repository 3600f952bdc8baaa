"""request_table / inter_token_latencies on hand-built event frames.

Times are written in ms (x MS ns) so the arithmetic in the comments stays readable."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.frames import REQUEST_COLUMNS
from infersight.correlate.requests import REQUEST_TABLE_COLUMNS, inter_token_latencies, request_table

MS = 1_000_000
S_PER_MS = 1e-3


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def events(rows: list[tuple]) -> pd.DataFrame:
    """rows: (ts_ms, request_id, event, value0, value1, reason)."""
    task = {1: "chat", 2: "code", 3: "chat", 4: "code", 5: "chat", 6: "chat"}
    return pd.DataFrame({
        "ts_ns": [r[0] * MS for r in rows], "end_ns": [0] * len(rows), "request_id": [r[1] for r in rows],
        "trace_id": [f"{r[1]:032x}" for r in rows], "task": [task[r[1]] for r in rows],
        "event": [r[2] for r in rows], "reason": [r[5] for r in rows],
        "value0": [r[3] for r in rows], "value1": [r[4] for r in rows]}).astype(REQUEST_COLUMNS)


# Request 1: plain.  Request 2: preempted twice (once in prefill, once in decode).
# Request 3: aborted after a preemption, no RESUMED, no first token.  Request 4: aborted while waiting.
# Request 5: not finished (left out).  Request 6: FINISHED without ARRIVED (left out).
EVENTS = events([
    (100, 1, "ARRIVED", 10, 0, ""), (150, 1, "SCHEDULED", 10, 4, ""), (300, 1, "FIRST_TOKEN", 0, 0, ""),
    (300, 1, "TOKENS", 1, 0, ""), (400, 1, "TOKENS", 2, 0, ""), (500, 1, "TOKENS", 1, 0, ""),
    (500, 1, "FINISHED", 4, 0, "stop"),
    (0, 2, "ARRIVED", 100, 0, ""), (10, 2, "SCHEDULED", 100, 0, ""), (20, 2, "PREEMPTED", 0, 0, "recompute"),
    (50, 2, "RESUMED", 0, 0, ""), (60, 2, "FIRST_TOKEN", 0, 0, ""), (60, 2, "TOKENS", 1, 0, ""),
    (70, 2, "PREEMPTED", 0, 0, "swap"), (90, 2, "RESUMED", 0, 0, ""), (100, 2, "TOKENS", 3, 0, ""),
    (120, 2, "TOKENS", 1, 0, ""), (120, 2, "FINISHED", 5, 0, "length"),
    (0, 3, "ARRIVED", 8, 0, ""), (30, 3, "SCHEDULED", 8, 0, ""), (40, 3, "PREEMPTED", 0, 0, "recompute"),
    (100, 3, "FINISHED", 0, 0, "abort"),
    (10, 4, "ARRIVED", 7, 0, ""), (60, 4, "FINISHED", 0, 0, "abort"),
    (0, 5, "ARRIVED", 3, 0, ""), (5, 5, "SCHEDULED", 3, 0, ""),
    (70, 6, "FINISHED", 2, 0, "stop"),
])


def test_request_table_decomposition() -> None:
    t = request_table(EVENTS).set_index("request_id")
    assert list(t.reset_index().columns) == REQUEST_TABLE_COLUMNS
    assert list(t.index) == [1, 2, 3, 4]
    # r1: queue 150-100=50, prefill 300-150=150, decode 500-300=200, e2e 400; ttft 200; itl 200/(4-1).
    # r2: queue 10; prefill window [10,60) minus stall [20,50)=30 -> 20; decode [60,120) minus
    #     [70,90)=20 -> 40; stall 50; e2e 120 = 10+20+50+40; ttft 60; itl (120-60)/(5-1) = 15.
    # r3: queue 30; stall [40, finish 100) = 60 (no RESUMED); prefill (100-30)-60 = 10; decode 0.
    # r4: never scheduled: queue = finish - arrival = 50, the rest 0.
    expected = {1: (50, 150, 0, 200, 400, 200, 200 / 3), 2: (10, 20, 50, 40, 120, 60, 15),
                3: (30, 10, 60, 0, 100, np.nan, np.nan), 4: (50, 0, 0, 0, 50, np.nan, np.nan)}
    for rid, (q, p, s, d, e2e, ttft, itl) in expected.items():
        row = t.loc[rid]
        got = [row.queue_s, row.prefill_s, row.preemption_stall_s, row.decode_s, row.e2e_s]
        assert got == pytest.approx([x * S_PER_MS for x in (q, p, s, d, e2e)])
        assert row.network_s == 0.0
        assert row.ttft_s == pytest.approx(ttft * S_PER_MS, nan_ok=True)
        assert row.itl_mean_s == pytest.approx(itl * S_PER_MS, nan_ok=True)
        parts_ns = sum(round(getattr(row, c) * 1e9) for c in
                       ("queue_s", "prefill_s", "preemption_stall_s", "decode_s", "network_s"))
        assert parts_ns == round(row.e2e_s * 1e9) == row.finish_ns - row.arrival_ns
    assert list(t.num_preemptions) == [0, 2, 1, 0]
    assert list(t.prompt_tokens) == [10, 100, 8, 7]
    assert list(t.cached_tokens) == [4, 0, 0, 0]
    assert list(t.output_tokens) == [4, 5, 0, 0]
    assert list(t.finish_reason) == ["stop", "length", "abort", "abort"]
    assert list(t.task) == ["chat", "code", "chat", "code"]
    assert list(t.first_scheduled_ns) == [150 * MS, 10 * MS, 30 * MS, -1]
    assert list(t.first_token_ns) == [300 * MS, 60 * MS, -1, -1]


def test_request_table_with_network() -> None:
    net = pd.DataFrame({"request_id": [1], "receive_ns": [80 * MS], "send_end_ns": [530 * MS]})
    t = request_table(EVENTS, net).set_index("request_id")
    # r1: network (100-80) + (530-500) = 50; e2e 530-80 = 450 = 50+150+0+200+50; ttft 300-80 = 220.
    assert t.loc[1, "network_s"] == pytest.approx(50 * S_PER_MS)
    assert t.loc[1, "e2e_s"] == pytest.approx(450 * S_PER_MS)
    assert t.loc[1, "ttft_s"] == pytest.approx(220 * S_PER_MS)
    # r2 is not in the network frame: unchanged.
    assert t.loc[2, "network_s"] == 0.0 and t.loc[2, "e2e_s"] == pytest.approx(120 * S_PER_MS)


def test_network_part_is_never_negative() -> None:
    """A last byte stamped 3 ms before the engine's finish (vLLM's mapped wall-clock F, seen at -2.3 ms in
    tests/vllm): the network part is the lead alone (100-98), e2e runs from the receive to F."""
    net = pd.DataFrame({"request_id": [1], "receive_ns": [98 * MS], "send_end_ns": [497 * MS]})
    row = request_table(EVENTS, net).set_index("request_id").loc[1]
    assert row.network_s == pytest.approx(2 * S_PER_MS)
    assert row.e2e_s == pytest.approx(402 * S_PER_MS)  # F - R: 500 - 98
    assert row.ttft_s == pytest.approx(202 * S_PER_MS)  # T - R: the lead still counts (300 - 98)


def test_request_table_empty() -> None:
    t = request_table(_empty(REQUEST_COLUMNS))
    assert t.empty and list(t.columns) == REQUEST_TABLE_COLUMNS
    assert t.dtypes.equals(request_table(EVENTS).dtypes)   # same dtypes empty or not


def test_request_table_keeps_ns_beyond_float_precision() -> None:
    # Monotonic clocks past 2**53 ns (~104 days of uptime) must not be rounded through float64.
    base = 2**60
    ev = events([(0, 1, "ARRIVED", 1, 0, ""), (0, 1, "FINISHED", 1, 0, "stop")])
    ev["ts_ns"] = [base + 1, base + 8]
    t = request_table(ev)
    assert t.loc[0, "arrival_ns"] == base + 1 and t.loc[0, "queue_s"] == pytest.approx(7e-9)


def test_inter_token_latencies_weights_by_tokens() -> None:
    itl = inter_token_latencies(EVENTS)
    assert list(itl.columns) == ["request_id", "task", "itl_s"]
    # r1: 400 - 300 = 100 over 2 tokens -> 50, 50; 500 - 400 = 100 over 1 -> 100.
    # r2: 100 - 60 = 40 over 3 -> 13.33 x 3 (the swap stall is inside: the client saw it); 120 - 100 = 20.
    assert list(itl.request_id) == [1, 1, 1, 2, 2, 2, 2]
    assert list(itl.task) == ["chat"] * 3 + ["code"] * 4
    assert list(itl.itl_s) == pytest.approx([x * S_PER_MS for x in (50, 50, 100, 40 / 3, 40 / 3, 40 / 3, 20)])
    empty = inter_token_latencies(_empty(REQUEST_COLUMNS))
    assert empty.empty and empty.dtypes.equals(itl.dtypes)
