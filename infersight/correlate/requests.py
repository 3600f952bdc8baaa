"""Per-request latency: an exact decomposition of end-to-end time, and inter-token latencies.
Which requests are slow, and why, is in slow_rule.py and slow_causes.py.

Decomposition, on the engine's one monotonic clock (A arrived, S first scheduled, T first token,
F finished; R received and E response sent when a network frame is given):

    R ---- A ------- S ------------ T ---------------- F ---- E
    network  queue      prefill       decode              network
                  preemption stalls [PREEMPTED, RESUMED) are cut out of prefill and decode

Every part is computed in integer ns and converted to seconds once, so in ns the parts sum to
e2e exactly: queue + prefill + preemption_stall + decode + network == e2e.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

NS = 1e9

#: The fields of one finished request as the agent reports and stores it (API rows, Parquet columns).
#: Cost (correlate.cost): engine_seconds is the request's token share of its steps' wall-clock time,
#: on any device; the GPU figures are NaN unless a GPU measured them: energy_j (a modelled split of
#: measured energy: the GPU energy counter over its steps, each step split by modelled cost,
#: correlate.token_cost) = energy_dynamic_j (its tokens' share of the steps' dynamic energy) +
#: energy_static_j (its share of the GPU's static draw in its steps), energy_sampling_bound_j (the
#: most the counter's sampling interval can have moved into or out of energy_j,
#: correlate.sampling_bound), gpu_sm_active_s (SM activity x step
#: time from GPU telemetry, split as energy_j is) and gpu_kernel_s (its share of kernel time in a
#: profiler capture).
REQUEST_FIELDS = ("request_id", "trace_id", "task", "prompt_tokens", "cached_tokens", "output_tokens", "finish_reason",
                  "num_preemptions", "queue_s", "prefill_s", "preemption_stall_s", "decode_s", "network_s", "e2e_s",
                  "ttft_s", "itl_mean_s", "engine_seconds", "energy_j", "energy_dynamic_j",
                  "energy_static_j", "energy_sampling_bound_j", "gpu_sm_active_s",
                  "gpu_kernel_s", "slow_cause")


REQUEST_TABLE_COLUMNS = [
    "request_id", "trace_id", "task", "prompt_tokens", "cached_tokens", "output_tokens", "finish_reason",
    "num_preemptions", "arrival_ns", "first_scheduled_ns", "first_token_ns", "finish_ns", "queue_s",
    "prefill_s", "preemption_stall_s", "decode_s", "network_s", "e2e_s", "ttft_s", "itl_mean_s"]
# Text columns are object, as in frames.py, whether or not the frame is empty (pandas 3 would
# otherwise infer its str dtype for non-empty frames only).
REQUEST_TABLE_DTYPES = {c: "object" if c in ("trace_id", "task", "finish_reason") else
                        "float64" if c.endswith("_s") else "int64" for c in REQUEST_TABLE_COLUMNS}
ITL_DTYPES = {"request_id": "int64", "task": "object", "itl_s": "float64"}
PARTS = ["queue_s", "prefill_s", "preemption_stall_s", "decode_s", "network_s"]


def _empty(dtypes: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in dtypes.items()})


def _objects(column: pd.Series) -> pd.Series:
    """The column's values as an object Series with a fresh RangeIndex."""
    return pd.Series(column.to_numpy(object), dtype=object, copy=False)


def _earliest(ev: pd.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(request ids ascending, row position in ev of each one's earliest `name` event; ties: the
    first in ev's order). Plain numpy over the columns: no string column is copied."""
    rows = np.flatnonzero((ev["event"] == name).to_numpy(bool))
    rows = rows[np.argsort(ev["ts_ns"].to_numpy(np.int64)[rows], kind="stable")]
    ids, first = np.unique(ev["request_id"].to_numpy(np.int64)[rows], return_index=True)
    return ids, rows[first]


def _first(ev: pd.DataFrame, name: str, ids: pd.Index, col: str = "ts_ns", fill: int = -1,
           earliest: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Per id in ids, `col` of the earliest `name` event (fill where none). Int64 all the way: a NaN
    round trip through float64 would lose ns beyond 2**53. `earliest`: _earliest(ev, name), if known."""
    have, rows = _earliest(ev, name) if earliest is None else earliest
    want = ids.to_numpy(np.int64)
    pos = np.minimum(np.searchsorted(have, want), max(len(have) - 1, 0))
    found = (have[pos] == want) if len(have) else np.zeros(len(want), bool)
    values = ev[col].to_numpy(np.int64)[rows[pos]] if len(have) else np.zeros(len(want), np.int64)
    return np.where(found, values, fill)


def _overlap(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of [a, b) intersected with [lo, hi), in ns (0 when disjoint)."""
    return np.maximum(0, np.minimum(b, hi) - np.maximum(a, lo))


def request_table(request_events: pd.DataFrame, network: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per request with a FINISHED event (and its ARRIVED; a request whose ARRIVED is
    missing, e.g. dropped by a full ring, cannot be decomposed and is left out), by request_id.

    Columns: request_id, trace_id, task, prompt_tokens (ARRIVED value0), cached_tokens (SCHEDULED
    value1, 0 if never scheduled), output_tokens (FINISHED value0), finish_reason, num_preemptions,
    arrival_ns, first_scheduled_ns, first_token_ns (-1: never happened), finish_ns, then seconds:
    queue_s, prefill_s, preemption_stall_s, decode_s, network_s, e2e_s, ttft_s, itl_mean_s.

    queue = S - A (a request never scheduled, e.g. aborted while waiting, queues until F);
    stall = sum of [PREEMPTED, next RESUMED) clipped to [S, F]; a PREEMPTED with no later RESUMED
    stalls until F (or until the next PREEMPTED if a RESUMED record was lost, so no overlap);
    prefill = (T, or F without a first token) - S - stall inside that window;
    decode = F - T - stall inside [T, F) (0 without a first token);
    network (network frame: request_id, receive_ns, send_end_ns, same clock) = (A - R) + (E - F),
    0 for requests absent from it; e2e = F - A + network;
    ttft_s = T - A (+ A - R with network); itl_mean_s = (F - T) / max(1, output_tokens - 1), the
    decode window as the client sees it, stalls included. Both NaN without a first token.
    """
    ev = request_events
    done_ids, done_rows = _earliest(ev, "FINISHED")  # by request id, ascending
    arrived = _earliest(ev, "ARRIVED")  # (ids that arrived, their first ARRIVED row)
    finished = ev.iloc[done_rows[np.isin(done_ids, arrived[0])]]
    if finished.empty:
        return _empty(REQUEST_TABLE_DTYPES)
    ids = pd.Index(finished["request_id"].to_numpy(np.int64))

    f = finished["ts_ns"].to_numpy(np.int64)
    scheduled = _earliest(ev, "SCHEDULED")  # used twice, as arrived is
    a = _first(ev, "ARRIVED", ids, earliest=arrived)
    s_raw = _first(ev, "SCHEDULED", ids, earliest=scheduled)
    t_raw = _first(ev, "FIRST_TOKEN", ids)
    f = np.maximum(f, a)
    # Clamp into order so every part is >= 0 and the telescoping sum stays exact.
    s = np.where(s_raw < 0, f, np.clip(s_raw, a, f))
    t = np.where(t_raw < 0, f, np.clip(t_raw, s, f))

    stall_pre, stall_dec, n_pre = _stalls(ev, ids, s, t, f)
    queue_ns = s - a
    prefill_ns = t - s - stall_pre
    decode_ns = f - t - stall_dec

    net_ns = np.zeros(len(ids), np.int64)
    lead_ns = np.zeros(len(ids), np.int64)  # A - R: the part of ttft before the engine saw it
    if network is not None and not network.empty:
        net = network.drop_duplicates("request_id").set_index("request_id")
        r = net["receive_ns"].astype(np.int64).reindex(ids, fill_value=-1).to_numpy()
        e = net["send_end_ns"].astype(np.int64).reindex(ids, fill_value=-1).to_numpy()
        has = (r >= 0) & (e >= 0)
        # Each side never below 0: on vLLM, F and A are wall-clock stamps of the API server mapped onto the
        # monotonic clock (vllm/translate.py), and a last byte has been seen stamped ~2 ms before F. e2e then
        # runs from the receive to the later of the last byte and F, and no part of it is a negative time.
        lead_ns = np.where(has, np.maximum(a - r, 0), 0)
        net_ns = np.where(has, lead_ns + np.maximum(e - f, 0), 0)

    out_tokens = finished["value0"].to_numpy(np.int64)
    has_token = t_raw >= 0
    table = pd.DataFrame({
        # Text columns as object Series: from bare object arrays pandas 3 would infer its str dtype,
        # and the cast back below would copy every column.
        "request_id": ids.to_numpy(), "trace_id": _objects(finished["trace_id"]),
        "task": _objects(finished["task"]),
        "prompt_tokens": _first(ev, "ARRIVED", ids, "value0", 0, arrived),
        "cached_tokens": _first(ev, "SCHEDULED", ids, "value1", 0, scheduled),
        "output_tokens": out_tokens, "finish_reason": _objects(finished["reason"]),
        "num_preemptions": n_pre, "arrival_ns": a, "first_scheduled_ns": s_raw, "first_token_ns": t_raw,
        "finish_ns": f, "queue_s": queue_ns / NS, "prefill_s": prefill_ns / NS,
        "preemption_stall_s": (stall_pre + stall_dec) / NS, "decode_s": decode_ns / NS,
        "network_s": net_ns / NS, "e2e_s": (f - a + net_ns) / NS,
        "ttft_s": np.where(has_token, (t - a + lead_ns) / NS, np.nan),
        "itl_mean_s": np.where(has_token, (f - t) / NS / np.maximum(1, out_tokens - 1), np.nan),
    })
    # Built with these dtypes already: cast (a copy of every column) only if one is not.
    if any(table[c].dtype != t for c, t in REQUEST_TABLE_DTYPES.items()):
        table = table.astype(REQUEST_TABLE_DTYPES)
    return table


def _stalls(ev: pd.DataFrame, ids: pd.Index, s: np.ndarray, t: np.ndarray, f: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request (aligned with ids): stall ns inside [S, T), stall ns inside [T, F), PREEMPTED count."""
    pr = ev[ev["event"].isin(["PREEMPTED", "RESUMED"]) & ev["request_id"].isin(ids)]
    if pr.empty:  # the common case: no preemption, and a groupby costs ms even on nothing
        zeros = np.zeros(len(ids), np.int64)
        return zeros, zeros.copy(), zeros.copy()
    pr = pr.sort_values(["request_id", "ts_ns"], kind="stable")
    nxt = pr.groupby("request_id")["ts_ns"].shift(-1, fill_value=-1).to_numpy(np.int64)
    is_pre = (pr["event"] == "PREEMPTED").to_numpy()
    pos = ids.get_indexer(pr["request_id"].to_numpy(np.int64))[is_pre]
    start = pr["ts_ns"].to_numpy(np.int64)[is_pre]
    end = np.where(nxt[is_pre] < 0, f[pos], nxt[is_pre])
    pre = np.zeros(len(ids), np.int64)
    dec = np.zeros(len(ids), np.int64)
    np.add.at(pre, pos, _overlap(start, end, s[pos], t[pos]))
    np.add.at(dec, pos, _overlap(start, end, t[pos], f[pos]))
    return pre, dec, np.bincount(pos, minlength=len(ids)).astype(np.int64)


def inter_token_latencies(request_events: pd.DataFrame) -> pd.DataFrame:
    """Columns request_id, task, itl_s: for each TOKENS event after a request's first, the gap since
    its previous TOKENS event divided by the tokens it emitted, repeated once per token, so a
    histogram weights by tokens (a speculative step emitting 3 tokens in 30 ms counts 3 x 10 ms).
    Gaps span preemption stalls: that is what the client sees. Empty input -> empty frame."""
    rid, codes, names, itl_s = inter_token_latency_arrays(request_events)
    task = np.asarray(names, dtype=object)[codes]
    return pd.DataFrame({"request_id": rid, "task": pd.Series(task, dtype=object, copy=False), "itl_s": itl_s})


def inter_token_latency_arrays(request_events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, pd.Index, np.ndarray]:
    """inter_token_latencies as arrays (request_id, task code, the task names the codes index,
    itl_s), row for row: for callers that split by task without building the frame."""
    ev = request_events
    rows = np.flatnonzero(((ev["event"] == "TOKENS") & (ev["value0"] > 0)).to_numpy(bool))
    rid, ts = ev["request_id"].to_numpy(np.int64)[rows], ev["ts_ns"].to_numpy(np.int64)[rows]
    order = np.lexsort((ts, rid))  # by request, then time; stable, like sort_values(kind="stable")
    rows, rid, ts = rows[order], rid[order], ts[order]
    prev = np.full(len(ts), -1, np.int64)
    same = rid[1:] == rid[:-1]
    prev[1:][same] = ts[:-1][same]  # the request's previous TOKENS event
    keep = prev >= 0
    rows = rows[keep]
    n = ev["value0"].to_numpy(np.int64)[rows]
    gap = ts[keep] - prev[keep]
    # Task names through their codes: one object per distinct task, not one str conversion per token.
    codes, names = pd.factorize(ev["task"])
    return (np.repeat(rid[keep], n), np.repeat(codes[rows], n), pd.Index(names),
            np.repeat(gap / NS / np.maximum(n, 1), n))
