"""Captures on vLLM through its profiler endpoints, and the agent's normalised view of its /metrics.

Pure part (no vLLM): vLLM's step ranges -> phases, which trace file is the worker's, the CPU-op
analysis of a hand-built trace with exact times, and the capture-target seam of the controller.
Live part: the real vLLM the live modules share (tiny Llama, profiler_dir set; shared_vllm.py):
the agent's view equals vLLM's own /metrics read by the test; `infersight capture --steps N`
through the agent gives an analysed trace of exactly N of vLLM's steps (counted by the test in the
raw trace); an agent watching a profiler directory that never fills says so in one line and serves.
"""
from __future__ import annotations

import gzip
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from shared_vllm import SharedVllm
from vllm_exposition_reader import assert_view_matches, read_samples, total

from infersight.agent.capture.controller import CaptureController, CaptureOutcome, CaptureRefused
from infersight.agent.config import AgentConfig
from infersight.agent.capture.config import CaptureConfig
from infersight.sources.vllm.http_config import VllmHttpConfig
from infersight.agent.service import Agent
from infersight.sources.vllm.profiler import analyze_vllm_trace, pick_worker_trace, step_phase, with_step_ranges
from infersight.vllm.client_workload import send_completion
from infersight.vllm.launch import REPO_ROOT, VllmServer

STEP = "execute_context_1(8)_generation_0(0)"


# -- pure ------------------------------------------------------------------------------------------
def test_vllm_step_ranges_name_their_phase() -> None:
    assert step_phase("execute_context_1(40)_generation_0(0)") == "prefill"
    assert step_phase("execute_context_0(0)_generation_3(3)") == "decode"
    assert step_phase("execute_context_2(70)_generation_5(5)") == "mixed"
    assert step_phase("execute_12_context_1(sq8sk8sqsq64sqsk64)_generation_1(sq1sk9sqsq1sqsk9)") == "mixed"
    assert step_phase("gpu_model_runner: forward") is None
    doc = {"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": STEP, "ts": 5, "dur": 9, "pid": 1,
                            "tid": 2}, {"ph": "X", "cat": "cpu_op", "name": STEP, "ts": 5, "dur": 1}]}
    out, steps = with_step_ranges(doc)
    assert steps == 1 and len(doc["traceEvents"]) == 2  # the input is left alone
    assert [(e["name"], e["ts"], e["dur"]) for e in out["traceEvents"]] == [
        ("step", 5, 9), ("forward.prefill", 5, 9), (STEP, 5, 9), (STEP, 5, 1)]


def test_the_worker_trace_is_ours_and_rank_zero() -> None:
    names = ["rank1.5.pt.trace.json.gz", "infersight-9-2_rank1.7.pt.trace.json.gz",
             "infersight-9-2_rank0.8.pt.trace.json.gz", "other_rank0.6.pt.trace.json.gz"]
    assert pick_worker_trace(names, "infersight-9-2") == "infersight-9-2_rank0.8.pt.trace.json.gz"
    assert pick_worker_trace(["rank1.5.pt.trace.json.gz", "rank0.9.pt.trace.json.gz"], "x") == \
        "rank0.9.pt.trace.json.gz"  # a vLLM that ignores the prefix
    assert pick_worker_trace([], "x") is None


def _op(name: str, ts: float, dur: float, op_id: int, tid: int = 2) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid,
            "args": {"External id": op_id}}


def test_a_cpu_trace_is_analysed_by_exclusive_op_time(tmp_path: Path) -> None:
    # One prefill step (0..100 µs): linear > onednn_mm > empty, then add; a copy after the step.
    # Exclusive µs: linear 5 + 5, onednn_mm 1 + 37, empty 2, add 10, copy 5.
    events = [{"ph": "X", "cat": "user_annotation", "name": STEP, "ts": 0, "dur": 100, "pid": 1, "tid": 2},
              _op("aten::linear", 10, 50, 1), _op("_C::onednn_mm", 15, 40, 2), _op("aten::empty", 16, 2, 3),
              _op("aten::add", 70, 10, 4), _op("aten::copy_", 200, 5, 5)]
    path = tmp_path / "rank0.1.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()))
    r = analyze_vllm_trace(str(path))
    assert r["device_kind"] == "cpu" and r["steps"] == 1
    assert r["kernels"] == {"count": 0, "total_ns": 0} and r["gpu_activity"]["total_ns"] == 0
    assert r["cpu_ops"] == {"count": 5, "total_ns": 65_000}
    assert {c["name"]: (c["count"], c["total_ns"]) for c in r["categories"]} == {
        "GEMM": (2, 48_000), "elementwise": (2, 15_000), "other": (1, 2_000)}
    prefill = next(p for p in r["phases"] if p["phase"] == "prefill")
    assert (prefill["steps"], prefill["activities"], prefill["kernel_ns"]) == (1, 4, 60_000)
    assert (prefill["window_ns"], prefill["busy_ns"], prefill["idle_ns"]) == (70_000, 60_000, 10_000)
    ranges = {x["name"]: x["kernel_ns"] for x in r["ranges"]}
    assert ranges == {"step": 60_000, "forward.prefill": 60_000, STEP: 60_000}
    top = r["top_kernels"][0]
    assert (top["name"], top["count"], top["total_ns"]) == ("_C::onednn_mm", 1, 38_000)
    assert any("one op takes" in f["text"] for f in r["findings"])


class ScriptedTarget:
    """The capture-target seam driven by hand (a test double of the seam, not of vLLM)."""

    name, tools = "scripted", ("torch",)

    def __init__(self) -> None:
        self.started: list[tuple[int, int]] = []
        self.outcome: CaptureOutcome | None = None

    def start(self, capture_id: int, steps: int) -> None:
        self.started.append((capture_id, steps))

    def poll(self) -> CaptureOutcome | None:
        outcome, self.outcome = self.outcome, None
        return outcome

    def close(self) -> None:
        pass


def test_a_capture_target_gets_the_same_rules_as_a_ring() -> None:
    target = ScriptedTarget()
    controller = CaptureController(min_interval_s=3600, target=target)
    with pytest.raises(ValueError, match="torch only"):
        controller.request([], 4, "cuda-profiler")
    record = controller.request([], 4, "torch")  # no ring needed
    assert (record.ring, record.state, target.started) == ("scripted", "running", [(1, 4)])
    with pytest.raises(CaptureRefused) as busy:
        controller.request([], 4, "torch")
    assert busy.value.status == 409
    assert controller.poll() == []
    target.outcome = CaptureOutcome("done", "/x.json.gz", {"steps": 4})
    assert controller.poll() == [record] and (record.state, record.analysis) == ("done", {"steps": 4})
    with pytest.raises(CaptureRefused) as soon:
        controller.request([], 4, "torch")
    assert soon.value.status == 429


# -- live: one real vLLM ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm(shared_llama: SharedVllm) -> tuple[VllmServer, Path]:
    """The shared server (shared_vllm.py) and its profiler directory, emptied of other modules' traces."""
    return shared_llama.server, shared_llama.fresh_profiles()


class Traffic:
    """Requests one after another on a thread until stopped (vLLM takes steps only with work)."""

    def __init__(self, url: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._thread.start()

    def _run(self, url: str) -> None:
        while not self._stop.is_set():
            send_completion(url, "tiny-llama", "the cache block token " * 4, 24, timeout_s=60)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def run_agent(config: AgentConfig) -> tuple[Agent, threading.Thread]:
    agent = Agent(config)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    return agent, thread


def _own_series(name: str) -> bool:
    """A series of vLLM's server process itself (HTTP handling, the process, Python's collector), not of vLLM."""
    return "http_" in name or "process_" in name or name.startswith("python_gc_")


def test_the_agent_serves_what_vllm_itself_says(vllm) -> None:
    server, _ = vllm
    prompts = ["You are a code assistant. def return import class " * 4 + f"question {i}" for i in range(4)]
    start = read_samples(httpx.get(server.url + "/metrics", timeout=10).text)  # a shared server: count from here
    for i, prompt in enumerate(prompts):  # shared prefix: later requests hit the prefix cache
        assert send_completion(server.url, "tiny-llama", prompt, 8 + i).status == 200
    before = httpx.get(server.url + "/metrics", timeout=10).text
    agent = Agent(AgentConfig(port=0, vllm_server=VllmHttpConfig(url=server.url, metrics_interval_s=60)))
    agent.start_http()
    try:
        assert agent.vllm_metrics.scrape_once() is not None
        ours = read_samples(httpx.get(f"http://127.0.0.1:{agent.port}/metrics", timeout=10).text)
        after = httpx.get(server.url + "/metrics", timeout=10).text
        theirs = read_samples(after)
        # Nothing of vLLM's moved between the two reads, so the views compare one state. The HTTP server's,
        # process's and Python collector's own series move with any work the server does, the scrapes
        # themselves included (stop 52's suite: one generation-0 collection between them).
        assert {k: v for k, v in theirs.items() if not _own_series(k[0])} == \
            {k: v for k, v in read_samples(before).items() if not _own_series(k[0])}
        def grew(name: str) -> float:
            return total(theirs, name) - total(start, name)

        assert grew("vllm:request_success_total") == 4 and grew("vllm:prefix_cache_hits_total") > 0
        assert_view_matches(ours, theirs)
    finally:
        agent.close()


def test_a_capture_of_n_vllm_steps_is_picked_up_and_analysed(vllm, tmp_path: Path) -> None:
    server, prof = vllm
    token = tmp_path / "token"
    agent, thread = run_agent(AgentConfig(port=0,
                                          vllm_server=VllmHttpConfig(url=server.url, profiler_dir=str(prof), metrics_interval_s=1.0),
                                          captures=CaptureConfig(min_interval_s=0, token_file=str(token))))
    traffic = Traffic(server.url)
    try:
        cli = subprocess.run([sys.executable, "-m", "infersight", "capture", "--steps", "4", "--agent",
                              f"127.0.0.1:{agent.port}", "--token-file", str(token), "--wait", "90"],
                             capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert f"capture 1 requested on vllm:{server.url}" in cli.stdout
        record = httpx.get(f"http://127.0.0.1:{agent.port}/api/v1/captures", timeout=10).json()["captures"][0]
        assert record["state"] == "done", record
        path = Path(record["path"])
        assert path.parent == prof and "async_llm" not in path.name and path.name.startswith("infersight-")
        raw = json.load(gzip.open(path))["traceEvents"]
        steps = [e["name"] for e in raw if e.get("cat") == "user_annotation" and e["name"].startswith("execute_")]
        assert len(steps) == 4  # vLLM's own bound (max_iterations), counted by the test in the raw trace
        a = record["analysis"]
        assert a["steps"] == 4 and "steps_counted" in a["capture"] and a["capture"]["trace_bytes"] < 1 << 20
        assert a["categories"] and a["top_kernels"] and a["findings"]
        assert {r["name"] for r in a["ranges"]} >= set(steps) | {"step"}  # vLLM's annotations, as ranges
        if a.get("device_kind") == "cpu":
            assert "GEMM" in {c["name"] for c in a["categories"]}
        assert httpx.get(f"http://127.0.0.1:{agent.port}/health", timeout=5).status_code == 200
    finally:
        traffic.stop()
        agent.stop()
        thread.join(timeout=60)


def test_a_profiler_dir_that_never_fills_is_reported_once(vllm, tmp_path: Path, caplog) -> None:
    server, _ = vllm
    caplog.set_level(logging.INFO, logger="infersight.agent")
    empty = tmp_path / "not-vllms-dir"
    empty.mkdir()
    agent, thread = run_agent(AgentConfig(port=0,
                                          vllm_server=VllmHttpConfig(url=server.url, profiler_dir=str(empty), metrics_interval_s=1.0, capture_wait_s=3),
                                          captures=CaptureConfig(min_interval_s=0, token="t0ken")))
    traffic = Traffic(server.url)
    base = f"http://127.0.0.1:{agent.port}"
    try:
        ok = httpx.post(base + "/api/v1/capture", json={"steps": 2}, headers={"Authorization": "Bearer t0ken"})
        assert ok.status_code == 202, ok.text
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            record = httpx.get(base + "/api/v1/captures", timeout=10).json()["captures"][0]
            if record["state"] not in ("requested", "running"):
                break
            time.sleep(0.5)
        assert record["state"] == "failed" and "no worker trace" in record["analysis"]["error"], record
        metrics = read_samples(httpx.get(base + "/metrics", timeout=10).text)
        assert total(metrics, "infersight_capture_failures_total", reason="no_trace") == 1
        lines = [r.getMessage() for r in caplog.records if "vLLM capture failed" in r.getMessage()]
        assert len(lines) == 1 and "\n" not in lines[0]
        assert httpx.get(base + "/health", timeout=5).status_code == 200
        assert total(metrics, "infersight_requests_total") > 0  # and it keeps serving vLLM's numbers
    finally:
        traffic.stop()
        agent.stop()
        thread.join(timeout=60)
