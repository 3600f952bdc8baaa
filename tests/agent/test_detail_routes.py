"""The detail routes (agent.api.detail_routes) on a live agent beside the tiny engine: one request
explained, two windows compared, who evicted whom; each checked against the engine's own record
(its step stats, outputs, and the probe calls teed in this process: probe_tee)."""
from __future__ import annotations

import httpx
import pytest
from agent_workload import make_engine, run_workload, unique_ring
from probe_tee import ProbeTee

from infersight.agent.config import AgentConfig
from infersight.agent.capture.config import CaptureConfig
from infersight.agent.gpu_config import GpuConfig
from infersight.agent.service import Agent


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    ring = unique_ring("detail")
    engine, probe = make_engine(ring)
    tee = ProbeTee.attach(probe)
    agent = Agent(AgentConfig(rings=[ring], port=0,
                              captures=CaptureConfig(token_file=str(tmp_path_factory.mktemp("tok") / "token")),
                              gpu=GpuConfig(source="none")))
    try:
        work = run_workload(engine, agent.poll_once)
        agent.poll_once()
        agent.start_http()
        yield work, tee, f"http://127.0.0.1:{agent.port}"
    finally:
        agent.close()
        probe.close()


def test_one_request_is_its_row_and_the_steps_it_was_in(live) -> None:
    work, tee, base = live
    for out in work.outputs:
        doc = httpx.get(f"{base}/api/v1/requests/{out.request_id}").json()
        ran_in = [s.step_id for s in work.steps if any(rid == out.request_id for rid, _ in s.batch)]
        assert [s["step_id"] for s in doc["steps"]] == ran_in and doc["steps_held"] == len(ran_in)
        fed = {s.step_id: n for s in work.steps for rid, n in s.batch if rid == out.request_id}
        assert {s["step_id"]: s["tokens_fed"] for s in doc["steps"]} == fed
        assert doc["num_preemptions"] == out.num_preemptions and doc["output_tokens"] == len(out.token_ids)
        parts = doc["ttft_parts_s"]
        assert parts["queue_s"] + parts["prefill_s"] + parts["stall_and_network_before_first_token_s"] == \
            pytest.approx(doc["ttft_s"])
        assert doc["bases"]["engine_seconds"].startswith("modelled") and doc["bases"]["ttft_s"].startswith("measured")
    assert httpx.get(f"{base}/api/v1/requests/999999").status_code == 404
    assert httpx.get(f"{base}/api/v1/requests/abc").status_code == 400


def test_evictions_are_joined_to_their_victims(live) -> None:
    work, tee, base = live
    expected = tee.evictions()
    assert expected, "the workload must evict cached blocks, or this test checks nothing"
    doc = httpx.get(f"{base}/api/v1/kv/evictions", params={"limit": 10_000}).json()
    assert doc["evictions_total"] == len(expected) == httpx.get(f"{base}/api/v1/summary").json()["kv"]["evictions"]
    assert [(e["evictor_request_id"], e["victim_request_id"]) for e in doc["recent"]] == expected
    tasks = {rid: task for rid, (_, task) in work.prompts.items()}
    pairs: dict[tuple[str, str], int] = {}
    for evictor, victim in expected:
        key = (tasks.get(evictor, "unknown"), tasks.get(victim, "unknown"))
        pairs[key] = pairs.get(key, 0) + 1
    assert {(p["evictor_task"], p["victim_task"]): p["evictions"] for p in doc["by_task_pair"]} == pairs
    assert httpx.get(f"{base}/api/v1/kv/evictions", params={"limit": "x"}).status_code == 400


def test_two_windows_split_the_requests_by_finish_time(live) -> None:
    work, tee, base = live
    times = sorted(tee.finished_wall.values())
    # Split at the widest gap between finishes: the agent's wall clock (an anchor) is within ms of ours.
    gap, at = max((b - a, i) for i, (a, b) in enumerate(zip(times, times[1:])))
    assert gap > 0.002
    mid = (times[at] + times[at + 1]) / 2
    a, b = (times[0] - 5, mid), (mid, times[-1] + 5)
    doc = httpx.get(f"{base}/api/v1/compare", params={"a": f"{a[0]},{a[1]}", "b": f"{b[0]},{b[1]}"}).json()
    assert doc["a"]["requests"] == at + 1 and doc["b"]["requests"] == len(times) - at - 1
    diff = doc["p50_difference"]["e2e_s"]
    assert diff["interval_95"][0] <= diff["b_minus_a"] <= diff["interval_95"][1]
    for bad in ("1,0", "x", "1,2,3", f"0,{1e9}"):
        assert httpx.get(f"{base}/api/v1/compare", params={"a": bad, "b": "1,2"}).status_code == 400
