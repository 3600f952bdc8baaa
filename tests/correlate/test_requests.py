"""request_table / inter_token_latencies / attribute_slow on hand-built event frames.

Times are written in ms (x MS ns) so the arithmetic in the comments stays readable."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.frames import REQUEST_COLUMNS
from infersight.correlate.requests import (
    REQUEST_TABLE_COLUMNS, SLOW_COLUMNS, attribute_slow, inter_token_latencies, request_table, rolling_p99,
)

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


def test_rolling_p99() -> None:
    v = np.arange(1, 101, dtype=float)
    assert rolling_p99(v) == pytest.approx(99.01)          # rank 0.99 * 99 = 98.01 -> 99 + 0.01
    assert rolling_p99(v, window=10) == pytest.approx(99.91)  # 91..100: rank 8.91 -> 99 + 0.91
    assert np.isnan(rolling_p99(np.array([])))


def _requests() -> pd.DataFrame:
    cols = ["request_id", "prompt_tokens", "num_preemptions", "queue_s", "prefill_s", "preemption_stall_s",
            "decode_s", "network_s"]
    rows = [
        (0, 10, 2, 0.1, 0.2, 0.3, 0.4, 0.0),   # stall 0.3 >= 25% of 1.0 -> preemption
        (1, 10, 1, 0.3, 0.0, 0.1, 0.6, 0.0),   # reloaded blocks -> kv_reload
        (2, 10, 0, 0.6, 0.2, 0.0, 0.2, 0.0),   # queue largest
        (3, 1000, 0, 0.1, 0.7, 0.0, 0.2, 0.0),  # prefill largest, 1000 > p90 109 -> long_prompt
        (4, 10, 0, 0.1, 0.2, 0.0, 0.7, 0.0),   # accept 2/10 -> speculation_rejections
        (5, 10, 0, 0.1, 0.2, 0.0, 0.7, 0.0),   # accept 8/10, steps mean 60 > median 10 -> batch_interference
        (6, 10, 0, 0.1, 0.2, 0.0, 0.7, 0.0),   # steps mean 3 < 10 -> unattributed
        (7, 10, 0, 0.01, 0.01, 0.0, 0.03, 0.0),  # e2e 0.05 < threshold: not reported
        (8, 10, 0, 0.1, 0.2, 0.0, 0.1, 0.6),   # network largest
        (9, 10, 0, 0.1, 0.7, 0.0, 0.2, 0.0),   # prefill largest, short prompt, step mean 80 -> batch_interference
    ]
    df = pd.DataFrame(rows, columns=cols)
    df["e2e_s"] = df[["queue_s", "prefill_s", "preemption_stall_s", "decode_s", "network_s"]].sum(axis=1)
    return df


def test_attribute_slow_rules_in_order() -> None:
    # p90 of prompt_tokens [10 x 9, 1000]: rank 0.9 * 9 = 8.1 -> 10 + 0.1 * 990 = 109.
    # Step totals from batch: s1 50+30=80, s2 40, s3 2, s4 3+1=4, s5 10 -> median 10.
    batch = pd.DataFrame({"step_id": [1, 1, 2, 3, 4, 4, 5], "request_id": [5, 9, 5, 6, 6, 0, 4],
                          "num_tokens": [50, 30, 40, 2, 3, 1, 10]})
    spec = pd.DataFrame({"request_id": [4, 4, 5], "proposed": [5, 5, 10], "accepted": [1, 1, 8]})
    kv = pd.DataFrame({"ts_ns": [1, 2, 3], "event": ["reloaded", "reloaded", "allocated"],
                       "block_id": [3, 4, 5], "request_id": [1, 1, 2], "block_hash": [0, 0, 0]})
    out = attribute_slow(_requests(), 0.5, batch=batch, spec=spec, kv_events=kv)
    assert list(out.columns) == SLOW_COLUMNS
    assert dict(zip(out.request_id, out.slow_cause)) == {
        0: "preemption", 1: "kv_reload", 2: "queue_wait", 3: "long_prompt", 4: "speculation_rejections",
        5: "batch_interference", 6: "unattributed", 8: "network", 9: "batch_interference"}
    detail = dict(zip(out.request_id, out.detail))
    assert detail[0] == "stalled 0.300 s of 1.000 s e2e (30%) over 2 preemption(s)"
    assert detail[1].startswith("2 KV block(s) reloaded")
    assert detail[3] == "prefill took 0.700 s of 1.000 s e2e for 1000 prompt tokens (p90 109)"
    assert detail[4] == "accepted 2 of 10 draft tokens (20%); decode took 0.700 s of 1.000 s e2e"
    # r5 steps s1 (80) and s2 (40): mean 60.
    assert detail[5] == "decode took 0.700 s of 1.000 s e2e in steps averaging 60.0 batch tokens (median step 10.0)"


def test_attribute_slow_without_data_and_from_steps_only() -> None:
    req = _requests()
    # Without kv/spec/batch: r1 (decode largest) has nothing left to check -> unattributed.
    out = attribute_slow(req, 0.5)
    assert dict(zip(out.request_id, out.slow_cause))[1] == "unattributed"
    none = attribute_slow(req, 10.0)
    assert none.empty and list(none.columns) == SLOW_COLUMNS and none.dtypes.equals(out.dtypes)
    # Steps only: membership by time overlap with [first_scheduled_ns, finish_ns].
    one = req[req.request_id == 6].assign(first_scheduled_ns=100, finish_ns=200)
    steps = pd.DataFrame({"step_id": [1, 2, 3], "start_ns": [90, 150, 300], "end_ns": [110, 160, 310],
                          "prefill_tokens": [30, 0, 1], "decode_tokens": [2, 4, 0], "spec_tokens": [0, 4, 0]})
    # Step tokens 32, 8, 1 -> median 8; r6 overlaps s1, s2 -> mean 20 > 8.
    out = attribute_slow(one, 0.5, steps=steps)
    assert list(out.slow_cause) == ["batch_interference"]
