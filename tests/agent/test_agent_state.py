"""AgentState fed by a real (tiny) engine through its ring: exact request decomposition, cost that
adds up to the engine's step time, exact drop accounting, the Parquet sink and the requests API."""
from __future__ import annotations

import math
import socket
import threading
from collections import defaultdict

import httpx
import numpy as np
import pandas as pd
import uvicorn

import pyarrow.parquet as pq
import pytest
from agent_workload import MAX_TOKENS, make_engine, run_workload, unique_ring
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infersight.agent.api import report
from infersight.agent.config import AgentConfig
from infersight.agent.rows.retention_config import RetentionConfig
from infersight.agent.api.server import build_app
from infersight.agent.service import Agent
from infersight.agent.state import AgentState
from infersight.correlate.requests import PARTS
from infersight.exporters import catalogue as C
from infersight.exporters.parquet import SCHEMA
from infersight.runtime import SamplingParams


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One workload, the agent polling after every step; the agent is closed (Parquet flushed)
    before the tests look. Its state and registry stay readable after close."""
    ring = unique_ring("state")
    parquet_dir = tmp_path_factory.mktemp("parquet")
    engine, probe = make_engine(ring)
    agent = Agent(AgentConfig(rings=[ring], port=0, parquet_dir=str(parquet_dir)))
    try:
        work = run_workload(engine, agent.poll_once)
        agent.poll_once()
        agent.close()
        yield work, agent, parquet_dir / "requests.parquet"
    finally:
        agent.close()  # a second close must be harmless (it used to overwrite the Parquet file)
        probe.close()


def _rows(agent: Agent) -> list[dict]:
    return list(agent.state.finished)


def test_every_request_finished_and_matches_the_engine(run) -> None:
    work, agent, _ = run
    rows = {r["request_id"]: r for r in _rows(agent)}
    assert sorted(rows) == sorted(work.prompts)
    for o in work.outputs:
        r = rows[o.request_id]
        assert r["task"] == work.prompts[o.request_id][1]
        assert r["trace_id"] == f"{o.trace_id:032x}"
        assert r["prompt_tokens"] == len(o.prompt_token_ids) == len(work.engine.tokenizer.encode(
            work.prompts[o.request_id][0]))
        assert (r["output_tokens"], r["finish_reason"]) == (MAX_TOKENS, "length")
        assert r["cached_tokens"] == o.num_cached_tokens
        assert r["num_preemptions"] == o.num_preemptions
    s = report.summary(agent.state)
    assert s["requests"] == s["requests_seen"] == len(work.prompts)


def test_decomposition_matches_the_engines_own_times(run) -> None:
    """Each part against the engine's Request.times (not the probe records the agent read): queue =
    first scheduled - arrival; stall = the sum of [preempted, resumed) (a request runs to its finish, so
    every preemption has its resumption); e2e and TTFT from arrival."""
    work, agent, _ = run
    for r in _rows(agent):
        assert all(r[p] >= 0 for p in PARTS), r
        assert r["network_s"] == 0.0  # no network frame: the engine's clock only
        times = work.engine.requests[r["request_id"]].times
        assert round(r["e2e_s"] * 1e9) == times.finish_ns - times.arrival_ns
        assert round(r["ttft_s"] * 1e9) == times.first_token_ns - times.arrival_ns
        assert round(r["queue_s"] * 1e9) == times.first_scheduled_ns - times.arrival_ns
        assert len(times.resumptions) == len(times.preemptions) == r["num_preemptions"]
        stall_ns = sum(back - ns for (ns, _), back in zip(times.preemptions, times.resumptions))
        assert round(r["preemption_stall_s"] * 1e9) == stall_ns
    # Preempted requests carry their stall in the preemption part, not in prefill or decode.
    stalled = [r for r in _rows(agent) if r["num_preemptions"]]
    assert stalled and all(r["preemption_stall_s"] > 0 for r in stalled)


def test_engine_seconds_add_up_to_step_time(run) -> None:
    work, agent, _ = run
    rows = _rows(agent)
    # Independently from the engine's StepStats: each step's duration split by tokens fed.
    expected: dict[int, float] = defaultdict(float)
    worked_ns = 0
    for st in work.steps:
        if not st.batch:  # a step that ran nobody is nobody's cost
            continue
        dur = st.end_ns - st.start_ns
        worked_ns += dur
        total = sum(n for _, n in st.batch)
        for rid, n in st.batch:
            expected[rid] += dur * n / total / 1e9
    assert sum(r["engine_seconds"] for r in rows) == pytest.approx(worked_ns / 1e9, rel=1e-12, abs=1e-9)
    for r in rows:  # largest-remainder rounding: at most 1 ns per step off the proportional share
        assert r["engine_seconds"] == pytest.approx(expected[r["request_id"]], abs=len(work.steps) * 1e-9)
    by_task = report.summary(agent.state)["cost"]["engine_seconds_by_task"]
    assert sum(by_task.values()) == pytest.approx(worked_ns / 1e9, abs=1e-9)
    for task in ("code", "json"):
        assert by_task[task] == pytest.approx(sum(r["engine_seconds"] for r in rows if r["task"] == task),
                                              abs=1e-12)


def test_a_cpu_run_reports_no_gpu_figure(run) -> None:
    """No GPU here: every GPU figure is absent (NaN, null in the API), not 0, and the summary says
    once why there is no energy."""
    _, agent, path = run
    for r in _rows(agent):
        assert all(math.isnan(r[k]) for k in ("energy_j", "gpu_sm_active_s", "gpu_kernel_s")), r
    cost = report.summary(agent.state)["cost"]
    assert cost["energy_j_by_task"] == {} and cost["energy"]["measured"] is False
    assert cost["energy"]["status"].startswith("energy not measured: no GPU energy counter was read (GPU telemetry")
    assert cost["energy"]["headline"] == "not measured: no GPU energy counter"
    table = pq.read_table(path).to_pandas()
    assert table[["energy_j", "gpu_sm_active_s", "gpu_kernel_s"]].isna().all().all()


def test_counters_match_the_engine(run) -> None:
    work, agent, _ = run
    outs = work.outputs
    s = report.summary(agent.state)
    assert s["kv"]["preemptions"] == sum(o.num_preemptions for o in outs)
    assert agent.state.counters[C.STEPS.name].total() == len(work.steps)
    assert agent.state.counters[C.PROMPT_TOKENS.name].total() == work.prompt_tokens()
    assert agent.state.counters[C.GENERATION_TOKENS.name].total() == MAX_TOKENS * len(outs)
    assert agent.state.counters[C.PREFIX_HIT.name].total() == sum(o.num_cached_tokens for o in outs)
    assert agent.state.counters[C.SPEC_DRAFT.name].total() == sum(o.num_spec_proposed for o in outs)
    assert agent.state.counters[C.SPEC_ACCEPTED.name].total() == sum(o.num_spec_accepted for o in outs)
    assert s["dropped_events"] == 0


def test_parquet_one_row_per_request(run) -> None:
    work, agent, path = run
    table = pq.read_table(path)
    assert table.schema.equals(SCHEMA)
    assert table.column_names == list(report.REQUEST_FIELDS)
    df = table.to_pandas()
    assert sorted(df["request_id"]) == sorted(work.prompts)
    assert df["request_id"].is_unique
    by_id = {r["request_id"]: r for r in _rows(agent)}
    for r in df.to_dict("records"):
        mine = by_id[r["request_id"]]
        for k in report.REQUEST_FIELDS:
            assert r[k] == mine[k] or (isinstance(r[k], float) and math.isnan(r[k]) and math.isnan(mine[k])), k


def test_parquet_survives_a_second_close(tmp_path) -> None:
    """Regression: ParquetSink.close() after a close rewrote the file as an empty table."""
    ring = unique_ring("close")
    engine, probe = make_engine(ring)
    agent = Agent(AgentConfig(rings=[ring], port=0, parquet_dir=str(tmp_path)))
    try:
        engine.add_request("hello", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        agent.close()
        agent.close()
        assert pq.read_table(tmp_path / "requests.parquet").num_rows == 1
    finally:
        probe.close()


def test_summary_requests_counts_beyond_retention() -> None:
    """Regression: summary["requests"] was len(retained rows). A byte budget smaller than one
    poll's rows keeps none of them (whole frames go, oldest first): the counts still say 5."""
    ring = unique_ring("retain")
    engine, probe = make_engine(ring)
    agent = Agent(AgentConfig(rings=[ring], port=0, retention=RetentionConfig(rows_bytes=1)))
    try:
        for i in range(5):
            engine.add_request(f"req {i}", SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        agent.poll_once()
        s = report.summary(agent.state)
        assert s["requests"] == s["requests_seen"] == 5
        assert report.slowest(agent.state, 100) == []  # the retained rows
        assert s["retention"]["requests"] == 0 and s["retention"]["evicted_requests"] == 5
    finally:
        agent.close()
        probe.close()


def test_drop_counts_are_exact() -> None:
    """A ring of 8 slots overflows every step: the agent reports exactly what the producer dropped."""
    ring = unique_ring("drops")
    engine, probe = make_engine(ring, ring_capacity=8)
    agent = Agent(AgentConfig(rings=[ring], port=0))
    try:
        for i in range(4):
            engine.add_request(f"prompt number {i} " * 2, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                                          task="code"))
        while engine.has_unfinished():
            engine.step()
            agent.poll_once()
        agent.poll_once()
        producer = probe.ring.stats()
        assert producer["dropped"] > 0
        assert producer["produced"] == producer["consumed"] + producer["dropped"]
        assert producer["corrupt"] == 0 and producer["backlog"] == 0
        assert producer["dropped_seen"] == producer["dropped"]  # the consumer's count, from sequence gaps
        s = report.summary(agent.state)
        assert s["dropped_events"] == producer["dropped"]
        assert s["rings"][ring]["produced"] == producer["produced"]
        fams = {f.name: f for f in text_string_to_metric_families(generate_latest(agent.registry).decode())}
        by_ring = lambda name: {sm.labels["ring"]: sm.value for sm in fams[name].samples}  # noqa: E731
        assert by_ring(C.PROBE_DROPPED.name) == {ring: producer["dropped"]}
        assert by_ring(C.PROBE_EVENTS.name) == {ring: producer["produced"]}
        assert by_ring(C.PROBE_CORRUPT.name) == {ring: 0}
        # Whatever requests survived the drops still decompose exactly.
        for r in agent.state.finished:
            assert abs(sum(r[p] for p in PARTS) - r["e2e_s"]) <= 1e-9
    finally:
        agent.close()
        probe.close()


@pytest.fixture(scope="module")
def api(run):
    """The agent's app on a real uvicorn server over the (closed) agent's state: base URL."""
    _, agent, _ = run
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(agent.state, agent.registry), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for _ in range(100):
        if server.started:
            break
        threading.Event().wait(0.05)
    yield url
    server.should_exit = True
    thread.join(timeout=5)
    sock.close()


def test_slowest_api(run, api) -> None:
    _, agent, _ = run
    resp = httpx.get(f"{api}/api/v1/requests", params={"slowest": 3})
    assert resp.status_code == 200
    got = resp.json()["requests"]
    assert [r["e2e_s"] for r in got] == sorted((r["e2e_s"] for r in _rows(agent)), reverse=True)[:3]
    # the cause in numbers; energy_basis says what energy_j is (null here: no GPU)
    assert all(set(r) == set(report.REQUEST_FIELDS) | {"slow_detail", "energy_basis"} for r in got)
    assert all(r["energy_basis"] is None for r in got)
    everything = httpx.get(f"{api}/api/v1/requests").json()["requests"]  # default 10: all six
    assert len(everything) == len(_rows(agent))


@pytest.mark.parametrize("bad", ["abc", "0", "-1", "10001", "2.5", ""])
def test_slowest_api_bad_query(api, bad: str) -> None:
    resp = httpx.get(f"{api}/api/v1/requests", params={"slowest": bad})
    assert resp.status_code == 400
    assert resp.headers["content-type"].startswith("application/json")
    assert "slowest" in resp.json()["error"]


def test_idle_steps_are_counted_too() -> None:
    """Regression: a step that scheduled nothing (no batch rows) was not counted, so
    `infersight bench agent` waited forever for its latency probe steps to show."""
    from infersight.runtime.stats import StepStats

    ring = unique_ring("idle")
    engine, probe = make_engine(ring)
    agent = Agent(AgentConfig(rings=[ring], port=0))
    try:
        for k in range(3):
            probe.on_step_end(StepStats(100 + k, 0, 1000, kv_blocks_total=64, kv_block_size=16))
        agent.poll_once()
        assert agent.state.counters[C.STEPS.name].total() == 3
        assert agent.state.last_step["step_id"] == 102
    finally:
        agent.close()
        probe.close()


def test_discovery_attaches_rings_not_their_control_blocks() -> None:
    from infersight.agent.rings.ingest import RingSet

    ring = unique_ring("disc")
    engine, probe = make_engine(ring)  # creates the ring and its "-ctl" control block
    rings = RingSet([], discover=True)
    try:
        rings.refresh()
        assert ring in rings.attached and f"{ring}-ctl" not in rings.attached
        assert f"{ring}-ctl" not in rings._next_try  # never tried, so never warned about
    finally:
        rings.close()
        probe.close()


def test_recent_ttft_p99_is_over_the_last_finished_requests_only() -> None:
    """The capture rules' TTFT p99: the last 200 finished requests (NaN TTFTs left out), from rows kept
    in several blocks; None below 20 values."""
    state = AgentState(AgentConfig(rings=["unused"]))
    ttfts = [float(i % 97) / 10 if i % 7 else float("nan") for i in range(1000)]
    assert state.recent_ttft_p99() is None
    for start in range(0, 1000, 37):  # polls of 37 rows: the newest 200 span several blocks
        chunk = ttfts[start:start + 37]
        state.finished.extend_frame(pd.DataFrame({"request_id": range(start, start + len(chunk)), "ttft_s": chunk}))
    last = [v for v in ttfts[-200:] if v == v]
    assert state.recent_ttft_p99() == float(np.quantile(last, 0.99))
    few = AgentState(AgentConfig(rings=["unused"]))
    few.finished.extend_frame(pd.DataFrame({"request_id": range(19), "ttft_s": [0.1] * 19}))
    assert few.recent_ttft_p99() is None
