"""`infersight demo --engine vllm` end to end, on the session's demo vLLM (shared_demo_vllm.py: the
trained tiny-moe, tiny-draft speculating), with the real agent as a subprocess: every output the
demo writes is there, the agent saw every request of the workload, and its speculation and expert
figures agree with references it does not read: vLLM's own /metrics (deltas over the demo, read
before by the test and after from the demo's vllm-metrics.prom), the workload as built here, and
the model's shape."""
from __future__ import annotations

import io
import json
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from shared_demo_vllm import drain_rings

from infersight.demo_vllm import DemoVllm, VllmDemoConfig, run_vllm_demo
from infersight.workload import WorkloadConfig, build_workload

N_REQUESTS = 16
MAX_TOKENS = 24
OUTPUTS = ("summary.json", "metrics.prom", "vllm-metrics.prom", "diagnosis.json", "requests.parquet", "report.html",
           "agent.log")
SPEC = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def spec_counters(text: str) -> dict[str, float]:
    """vLLM's speculation counters (summed over label sets), by family name."""
    return {f.name: sum(s.value for s in f.samples if s.name.endswith("_total"))
            for f in text_string_to_metric_families(text) if f.name in SPEC}


@pytest.fixture(scope="module")
def demo(demo_moe: DemoVllm, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    drain_rings(demo_moe)  # earlier modules' requests on the shared server are not this demo's
    with urllib.request.urlopen(demo_moe.server.url + "/metrics", timeout=10) as resp:  # noqa: S310
        before = spec_counters(resp.read().decode())
    out = tmp_path_factory.mktemp("vllm-demo-run")
    printed = io.StringIO()
    config = VllmDemoConfig(out_dir=out, num_requests=N_REQUESTS, max_tokens=MAX_TOKENS, seed=0)
    summary = run_vllm_demo(config, Console(file=printed, width=140), vllm=demo_moe)
    after = spec_counters((out / "vllm-metrics.prom").read_text())
    return {"out": out, "summary": summary, "printed": printed.getvalue(),
            "vllm_spec": {name: after[name] - before.get(name, 0.0) for name in SPEC}}


def test_the_demo_writes_every_output_and_the_summary_it_printed(demo: dict[str, Any]) -> None:
    out: Path = demo["out"]
    assert [name for name in OUTPUTS if not (out / name).is_file()] == []
    assert json.loads((out / "summary.json").read_text()) == demo["summary"]
    assert "speculation, other" in demo["printed"] and "MoE max/mean load" in demo["printed"]
    assert demo["summary"]["sources"] and not demo["summary"]["dropped_events"]


def test_the_agent_saw_every_request_of_the_workload(demo: dict[str, Any]) -> None:
    workload = build_workload(WorkloadConfig(num_requests=N_REQUESTS, max_tokens=MAX_TOKENS, seed=0))
    rows = pd.read_parquet(demo["out"] / "requests.parquet")
    assert demo["summary"]["requests"] == len(rows) == N_REQUESTS
    assert Counter(rows["task"]) == Counter(r.task for r in workload)
    assert (rows["output_tokens"] == MAX_TOKENS).all()  # ignore_eos: each request runs to max_tokens


def test_speculation_is_vllms_own_count_of_the_trained_draft(demo: dict[str, Any]) -> None:
    """vLLM attributes drafts to steps, not requests: the agent files them under task 'other'. Its
    verifications and accept rate equal vLLM's own counters over the demo."""
    vllm = demo["vllm_spec"]
    spec = demo["summary"]["spec"]["by_task"]
    assert set(spec) == {"other"}
    other = spec["other"]
    assert other["samples"]["verifications"] == vllm["vllm:spec_decode_num_drafts"] > 0
    rate = vllm["vllm:spec_decode_num_accepted_tokens"] / vllm["vllm:spec_decode_num_draft_tokens"]
    assert other["accept_rate"] == pytest.approx(rate, abs=1e-12)
    assert other["gamma"] == 4.0  # our engine's draft length (demo_engine_config), passed to vLLM


def test_expert_load_covers_every_layer_and_expert_of_the_served_model(demo: dict[str, Any],
                                                                      demo_moe: DemoVllm) -> None:
    """The matrix has the served checkpoint's shape (its config.json, read here); every token passes
    every layer and picks top-k experts, so each layer's total is the same multiple of top-k, and it
    covers at least what the requests needed forwarded: their uncached prompt tokens and every
    output token but the last."""
    config = json.loads((Path(demo_moe.server.config.model) / "config.json").read_text())
    matrix = demo["summary"]["moe"]["expert_tokens"]
    assert len(matrix) == config["num_hidden_layers"] and {len(row) for row in matrix} == {config["num_local_experts"]}
    per_layer = {sum(row) for row in matrix}
    assert len(per_layer) == 1
    total = per_layer.pop()
    assert total % config["num_experts_per_tok"] == 0
    rows = pd.read_parquet(demo["out"] / "requests.parquet")
    needed = int((rows["prompt_tokens"] - rows["cached_tokens"]).sum() + (rows["output_tokens"] - 1).sum())
    assert total // config["num_experts_per_tok"] >= needed > 0
