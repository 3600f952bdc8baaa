"""The hook inside the real Agent (service.py wiring): configured by AgentConfig, fed by poll_once,
its counters on the agent's /metrics; and the tracing flags of `infersight agent`."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest
from serve_fixtures import MODEL, Harness

from infersight.agent.config import AgentConfig
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.agent.service import Agent
from infersight.serve.config import ServeConfig
from infersight.tracing import hook as hook_module
from infersight.tracing.config import TracingConfig

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def test_agent_poll_builds_spans_and_serves_the_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    memory = InMemorySpanExporter()
    monkeypatch.setattr(hook_module, "otlp_span_exporter", lambda endpoint, protocol=None, **_: memory)
    with Harness(ServeConfig(model_name=MODEL), speculative=True) as h:
        async def go() -> None:
            async with h.client() as c:
                for i in range(3):
                    r = await c.post("/v1/completions", json={"prompt": f"request {i}", "max_tokens": 6,
                                                              "ignore_eos": True})
                    assert r.status_code == 200
        asyncio.run(go())
        h.wait_idle()
        agent = Agent(AgentConfig(rings=[h.ring], port=0, tracing=TracingConfig(otlp_endpoint="http://127.0.0.1:1"),
                                  exposition=ExpositionConfig(model_name=MODEL)))
        try:
            agent.poll_once()
            agent.tracing.flush()
            text = generate_latest(agent.registry).decode()
        finally:
            agent.close()
    spans = [s for s in memory.get_finished_spans() if s.name == f"text_completion {MODEL}"]
    assert len(spans) == 3 and agent.tracing.kept == 3
    assert all(0 <= s.attributes["infersight.spec.accept_rate"] <= 1 for s in spans)  # the draft model ran
    assert all(s.attributes["infersight.spec.proposed"] > 0 for s in spans)
    assert "infersight_otlp_spans_exported_total" in text and "infersight_otlp_spans_dropped_total" in text


def test_bad_tracing_settings_are_config_errors() -> None:
    with pytest.raises(ValueError, match="trace sample ratio"):  # the tracing part validates itself
        TracingConfig(trace_sample_ratio=1.5)
    with pytest.raises(ValueError, match="OTLP protocol"):
        TracingConfig(otlp_protocol="http/json")
    res = subprocess.run([sys.executable, "-m", "infersight", "agent", "--ring", "x", "--otlp-endpoint",
                          "http://127.0.0.1:1", "--trace-sample-ratio", "2"],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "trace sample ratio" in res.stderr.strip().splitlines()[-1]


def test_request_spans_carry_the_kernel_summary_of_a_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """When a capture covered a request's steps, its span gets the request's share of kernel time
    and its top categories (here the agent's per-request table is filled by hand, as the capture
    analysis would fill it; the join itself is tested in tests/kernels)."""
    memory = InMemorySpanExporter()
    monkeypatch.setattr(hook_module, "otlp_span_exporter", lambda endpoint, protocol=None, **_: memory)
    with Harness(ServeConfig(model_name=MODEL)) as h:
        async def go() -> list[int]:
            ids = []
            async with h.client() as c:
                for i in range(2):
                    r = await c.post("/v1/completions", json={"prompt": f"req {i}", "max_tokens": 4, "ignore_eos": True})
                    ids.append(int(r.headers["x-infersight-request-id"]))
            return ids
        ids = asyncio.run(go())
        h.wait_idle()
        agent = Agent(AgentConfig(rings=[h.ring], port=0, tracing=TracingConfig(otlp_endpoint="http://127.0.0.1:1"),
                                  exposition=ExpositionConfig(model_name=MODEL)))
        try:
            agent.state.add_kernel_summaries({ids[0]: {"kernel_ns": 1234, "top": [
                {"category": "GEMM", "kernel_ns": 1000, "share": 0.81}, {"category": "norm", "kernel_ns": 234,
                                                                          "share": 0.19}]}})
            agent.poll_once()
            agent.tracing.flush()
        finally:
            agent.close()
    requests = [s for s in memory.get_finished_spans() if s.name == f"text_completion {MODEL}"]
    covered = [s for s in requests if "infersight.kernel.ns" in s.attributes]
    assert len(requests) == 2 and len(covered) == 1  # only the request the capture covered
    attrs = covered[0].attributes
    assert attrs["infersight.request_id"] == ids[0]
    assert attrs["infersight.kernel.ns"] == 1234
    assert list(attrs["infersight.kernel.top_categories"]) == ["GEMM", "norm"]
    assert list(attrs["infersight.kernel.top_ns"]) == [1000, 234]
