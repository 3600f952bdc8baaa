"""Expert load on a real vLLM: the tiny Mixtral (4 layers, 4 experts, top-2) served with the
infersight general plugin, read by the agent. Expected values come from vLLM's own /metrics and
from the test's request log, never from the plugin:

    tokens forwarded = prompt tokens computed (vllm:prompt_tokens_by_source{source="local_compute"})
                     + generated tokens (vllm:generation_tokens) - one per finished request
    (a request's last sampled token is returned, never fed back), and each layer's experts receive
    top_k x tokens forwarded. Prefix caching is off and the KV cache holds the whole workload, so
    nothing is cached or preempted (asserted).
"""
from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families
from testkit import free_port

from infersight.agent.config import AgentConfig
from infersight.agent.capture.config import CaptureConfig
from infersight.agent.gpu_config import GpuConfig
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.agent.service import Agent
from infersight.probes.ring import list_rings
from infersight.vllm.launch import VllmServer, VllmServerConfig

MODEL = "tiny-mixtral"
TOP_K, N_LAYERS, N_EXPERTS = 2, 4, 4
MAX_EXPERT_SERIES = 8  # < 4 x 4 pairs: the exposition must fall back to layer="all" plus hot pairs
PROMPTS = [("the cache block token " * n).strip() for n in (1, 3, 5, 8, 2, 13)]
MAX_TOKENS = [4, 7, 5, 9, 6, 3]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read().decode()


def _vllm_counters(base_url: str) -> dict[str, float]:
    """The vLLM counters the expected token count is made of, summed over label sets."""
    out = {"local_compute": 0.0, "generation": 0.0, "finished": 0.0, "preemptions": 0.0, "cached": 0.0}
    for fam in text_string_to_metric_families(_get(base_url + "/metrics")):
        for s in fam.samples:
            if s.name == "vllm:prompt_tokens_by_source_total" and s.labels.get("source") == "local_compute":
                out["local_compute"] += s.value
            elif s.name == "vllm:generation_tokens_total":
                out["generation"] += s.value
            elif s.name == "vllm:request_success_total":
                out["finished"] += s.value
            elif s.name == "vllm:num_preemptions_total":
                out["preemptions"] += s.value
            elif s.name == "vllm:prompt_tokens_cached_total":
                out["cached"] += s.value
    return out


def _complete(base_url: str, prompt: str, max_tokens: int) -> dict:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def _worker_ring(server: VllmServer, timeout_s: float = 30) -> str:
    """The ring of this server's worker: its name carries the worker's pid, and the worker is in
    the server's process group (VllmServer starts a new session)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name in list_rings("infersight-vllm-worker-"):
            try:
                if os.getpgid(int(name.rsplit("-", 1)[1])) == server.proc.pid:
                    return name
            except (ProcessLookupError, ValueError):
                continue
        time.sleep(0.5)
    raise AssertionError("the vLLM worker wrote no infersight-vllm-worker-<pid> ring")


def _matrix(agent_url: str) -> list[list[int]]:
    return json.loads(_get(agent_url + "/api/v1/summary"))["moe"]["expert_tokens"]


@pytest.fixture(scope="module")
def served(tiny_mixtral: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One vLLM (tiny Mixtral, plugin on) and one agent on its worker's ring, for the whole module.
    Its own server, not the shared tiny Llama (shared_vllm.py): another model, prefix caching off
    (the token relation above), and vLLM's default compiled forward, which the counter runs inside."""
    tmp = tmp_path_factory.mktemp("vllm-experts")
    config = VllmServerConfig(model=str(tiny_mixtral), port=free_port(), served_model_name=MODEL,
                              enable_prefix_caching=False, max_num_seqs=4, cwd=str(tmp),
                              env={"INFERSIGHT_EXPERT_COUNTS": "1"})
    with VllmServer(config, log_path=tmp / "vllm.log") as server:
        agent = Agent(AgentConfig(rings=[_worker_ring(server)], port=free_port(), poll_interval_s=0.05,
                                  parquet_dir=str(tmp / "agent"), gpu=GpuConfig(source="none"),
                                  exposition=ExpositionConfig(max_expert_series=MAX_EXPERT_SERIES),
                                  captures=CaptureConfig(token="test")))
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        agent_url = f"http://127.0.0.1:{agent.port}"
        try:
            yield {"server": server, "agent": agent, "agent_url": agent_url, "thread": thread, "tmp": tmp}
        finally:
            agent.stop()
            thread.join(timeout=30)


@pytest.fixture(scope="module")
def workload(served: dict) -> dict:
    """Six completions, three at a time; deltas of vLLM's counters and of the agent's matrix."""
    base, agent_url = served["server"].url, served["agent_url"]
    time.sleep(0.5)
    before_vllm, before_matrix = _vllm_counters(base), _matrix(agent_url)
    with ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(lambda pm: _complete(base, *pm), zip(PROMPTS, MAX_TOKENS)))
    after_vllm = _vllm_counters(base)
    delta = {k: after_vllm[k] - before_vllm[k] for k in after_vllm}
    expected = int(delta["local_compute"] + delta["generation"] - delta["finished"])
    deadline, matrix = time.monotonic() + 15, _matrix(agent_url)
    while time.monotonic() < deadline:  # the agent polls every 50 ms; the worker writes at each step's end
        matrix = _matrix(agent_url)
        if len(matrix) >= N_LAYERS and all(sum(row) >= TOP_K * expected + _row(before_matrix, i)
                                           for i, row in enumerate(matrix[:N_LAYERS])):
            break
        time.sleep(0.1)
    return {"responses": responses, "delta": delta, "expected_tokens": expected, "before": before_matrix,
            "after": matrix}


def _row(matrix: list[list[int]], layer: int) -> int:
    return sum(matrix[layer]) if layer < len(matrix) else 0


def test_vllm_counters_and_request_log_agree_on_tokens_forwarded(workload: dict) -> None:
    delta = workload["delta"]
    assert delta["preemptions"] == 0 and delta["cached"] == 0  # the relation below assumes both
    assert delta["finished"] == len(PROMPTS)
    usage = [r["usage"] for r in workload["responses"]]
    assert [u["completion_tokens"] for u in usage] == MAX_TOKENS
    from_log = sum(u["prompt_tokens"] + u["completion_tokens"] - 1 for u in usage)
    assert workload["expected_tokens"] == from_log


def test_each_layer_routes_top_k_times_tokens_forwarded(workload: dict) -> None:
    after, before = workload["after"], workload["before"]
    assert len(after) == N_LAYERS and all(len(row) == N_EXPERTS for row in after)
    per_layer = [sum(after[i]) - _row(before, i) for i in range(N_LAYERS)]
    assert per_layer == [TOP_K * workload["expected_tokens"]] * N_LAYERS


def test_prometheus_series_are_bounded_by_max_expert_series(served: dict, workload: dict) -> None:
    """16 (layer, expert) pairs > the cap of 8: one series per expert summed over layers, and hot pairs."""
    text = _get(served["agent_url"] + "/metrics")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    tokens = [s for s in fams["infersight_moe_expert_tokens"].samples if s.name.endswith("_total")]
    matrix = served["agent"].state.expert_tokens
    assert sorted((s.labels["layer"], s.labels["expert"]) for s in tokens) == [("all", str(e)) for e in range(N_EXPERTS)]
    assert {s.labels["expert"]: s.value for s in tokens} == {str(e): float(matrix[:, e].sum()) for e in range(N_EXPERTS)}
    hot = fams["infersight_moe_hot_expert_tokens"].samples
    assert 0 < len(hot) <= served["agent"].config.exposition.top_hot_pairs
    assert all(s.value == float(matrix[int(s.labels["layer"]), int(s.labels["expert"])]) for s in hot)


def test_parquet_moe_frame_holds_the_full_matrix(served: dict, workload: dict) -> None:
    served["agent"].stop()
    served["thread"].join(timeout=30)  # Agent.close() flushes the Parquet sink
    moe = pd.read_parquet(served["tmp"] / "agent" / "events" / "moe.parquet")
    by_cell = moe.groupby(["layer", "expert"])["tokens"].sum()
    assert {(int(l), int(e)): int(v) for (l, e), v in by_cell.items()} == {
        (l, e): int(workload["after"][l][e]) for l in range(N_LAYERS) for e in range(N_EXPERTS)}
