"""On-demand capture end to end: token, one at a time, rate limit, the engine's trace written."""
from __future__ import annotations

import gzip
import json
import os
import stat
import time

import httpx
import pytest
import torch

from infersight.agent.config import AgentConfig
from infersight.agent.capture.config import CaptureConfig
from infersight.agent.service import Agent
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig, ModelConfig, SamplingParams

TINY = ModelConfig("cap-moe", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, n_experts=4, top_k=2,
                   max_seq_len=128)


@pytest.fixture
def setup(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    name = f"infersight-captest-{os.getpid()}-{time.monotonic_ns()}"
    probe = ProbeObserver(ProbeConfig(ring_name=name, capture_dir=str(tmp_path / "captures")))
    engine = Engine(EngineConfig(model=TINY), probe)
    agent = Agent(AgentConfig(rings=[name], port=0,
                              captures=CaptureConfig(token_file=str(tmp_path / "token"), min_interval_s=3600)))
    agent.poll_once()
    agent.start_http()
    yield engine, agent, probe, tmp_path
    agent.close()
    probe.close()
    torch.set_num_threads(threads)


def test_capture_requires_the_token_and_writes_a_trace_of_the_next_steps(setup):
    engine, agent, probe, tmp_path = setup
    token_path = tmp_path / "token"
    assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
    token = token_path.read_text().strip()
    url = f"http://127.0.0.1:{agent.port}/api/v1/capture"
    assert httpx.post(url, json={"steps": 3}).status_code == 401
    assert httpx.post(url, json={"steps": 3}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    bad = httpx.post(url, json={"steps": 0}, headers={"Authorization": f"Bearer {token}"})
    assert bad.status_code == 400 and "steps" in bad.json()["error"]
    ok = httpx.post(url, json={"steps": 3, "tool": "torch"}, headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 202
    busy = httpx.post(url, json={"steps": 3}, headers={"Authorization": f"Bearer {token}"})
    assert busy.status_code == 409  # one at a time
    for i in range(3):
        engine.add_request([10 + i] * 20, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    assert steps >= 4  # the capture window (3 steps) closed inside the run
    agent.poll_once()
    record = httpx.get(f"http://127.0.0.1:{agent.port}/api/v1/captures").json()["captures"][0]
    assert record["state"] == "done", record
    trace = json.load(gzip.open(record["path"]))
    names = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    # Exactly the 3 steps after the request: one "step" range each, with the layer ranges inside.
    assert names.count("step") == 3
    assert probe.control.first_step == 1  # requested before the first step: steps 1..3 were captured
    assert names.count("layer.0.attention") >= 3 and "schedule" in names
    # The agent analysed it: on a CPU machine there are no GPU kernels, and it says so plainly.
    if torch.cuda.is_available():
        assert {"source", "kernels", "categories", "ranges", "findings"} <= set(record["analysis"])
    else:
        assert "no GPU kernel" in record["analysis"]["error"]
    # Rate limit: the next request within the interval is refused.
    again = httpx.post(url, json={"steps": 1}, headers={"Authorization": f"Bearer {token}"})
    assert again.status_code == 429


def test_auto_capture_fires_on_kv_pressure_with_cooldown(setup):
    engine, agent, probe, tmp_path = setup
    agent.captures.min_interval_s = 0
    agent.captures.rules.kv_usage = 0.0  # any use of the KV pool counts as pressure
    engine.add_request([5] * 30, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    engine.step()
    agent.poll_once()
    assert len(agent.captures.records) == 1 and agent.captures.records[0].reason.startswith("auto: kv usage")
    while engine.has_unfinished():
        engine.step()
    agent.poll_once()
    agent.poll_once()
    assert len(agent.captures.records) == 1  # the cool-down holds the rule back
    # The engine stopped before the 20-step window ended: closing the probes ends the capture
    # (a profiler left running would record every later op of the process).
    probe.capture.close()
    assert not torch.autograd.profiler._is_profiler_enabled
    agent.poll_once()
    assert agent.captures.records[0].state == "done"


def test_capture_writes_the_shapes_of_every_captured_step(setup):
    # Three prompts of 20 tokens, 6 tokens each, greedy; the capture covers steps 1..3. Step 1
    # prefills all three prompts at once (budget 512 tokens), so each has KV length 20; every
    # later step feeds one token per sequence, so KV length 20 + k at step 1 + k.
    engine, agent, probe, tmp_path = setup
    token = (tmp_path / "token").read_text().strip()
    ok = httpx.post(f"http://127.0.0.1:{agent.port}/api/v1/capture", json={"steps": 3, "tool": "torch"},
                    headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 202
    ids = [engine.add_request([10 + i] * 20, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
           for i in range(3)]
    while engine.has_unfinished():
        engine.step()
    agent.poll_once()
    record = httpx.get(f"http://127.0.0.1:{agent.port}/api/v1/captures").json()["captures"][0]
    shapes_file = record["path"].removesuffix(".json.gz") + ".shapes.json"
    doc = json.load(open(shapes_file))
    assert doc["format"] == "infersight-capture-shapes/1" and doc["dtype_bytes"] == 4 and doc["first_step"] == 1
    assert doc["model"]["d_model"] == TINY.d_model and doc["model"]["n_experts"] == TINY.n_experts
    assert doc["steps"] == [
        {"step_id": 1, "phase": "prefill", "seqs": [[rid, 20, 20] for rid in ids]},
        {"step_id": 2, "phase": "decode", "seqs": [[rid, 1, 21] for rid in ids]},
        {"step_id": 3, "phase": "decode", "seqs": [[rid, 1, 22] for rid in ids]},
    ]


def test_a_cuda_profiler_capture_points_at_its_shapes_file(tmp_path):
    # cudaProfilerStart/Stop leaves no trace of ours (nsys or ncu writes it): the engine reports
    # the shapes file instead, and the agent says how to analyse the external trace with it.
    import dataclasses

    import pandas as pd

    from infersight.agent.service import analyze_capture

    shapes = tmp_path / "capture-7-1.shapes.json"
    shapes.write_text(json.dumps({"format": "infersight-capture-shapes/1", "model": dataclasses.asdict(TINY),
                                  "dtype_bytes": 2, "first_step": 4, "steps": []}))
    report, per_request = analyze_capture(str(shapes), pd.DataFrame(), 4)
    assert per_request == {} and report["shapes"] == str(shapes)
    assert f"--shapes {shapes}" in report["note"]


def _wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_gpu_profiling_counters_pause_while_a_capture_runs(setup):
    engine, agent, probe, tmp_path = setup
    token = (tmp_path / "token").read_text().strip()
    assert not agent.gpu.profiling_paused
    ok = httpx.post(f"http://127.0.0.1:{agent.port}/api/v1/capture", json={"steps": 2, "tool": "torch"},
                    headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 202
    assert _wait_for(lambda: agent.gpu.profiling_paused)  # applied by the sampler thread at once
    assert agent.captures.records[0].gpu_profiling == "paused"
    engine.add_request([5] * 10, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    agent.poll_once()  # the capture is done: counters resume
    assert agent.captures.records[0].state == "done"
    assert _wait_for(lambda: not agent.gpu.profiling_paused)
