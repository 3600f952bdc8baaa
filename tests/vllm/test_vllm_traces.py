"""A real vLLM's request spans, joined by `infersight agent` with the plugin's records, arrive at a
real Phoenix as one tree in the caller's trace:

    caller's span (traceparent we send) -> text_completion <model> / chat <model> (vLLM's span id)
                                             -> queue / prefill / decode

The vLLM is the one the live modules share (shared_vllm.py): the tiny Llama with the stat-logger
plugin (entry point) and our middleware, sending its spans over OTLP/gRPC (its default) to the
agent's receiver while this module holds the port; the agent (a separate process, as a user runs
it) exports to Phoenix over OTLP/HTTP. Expected values come from
what the test sent (trace context, request ids) and from vLLM's own responses (usage).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from phoenix_server import phoenix_spans, ts
from prometheus_client.parser import text_string_to_metric_families
from shared_vllm import MODEL, SharedVllm
from testkit import free_port

from infersight.vllm.launch import VllmServer

REPO = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = {"text_completion": "00f067aa0ba902b7", "chat": "00f067aa0ba902b8"}  # the caller's span of each call
SECRET = "zebras juggle quietly under violet lamps"


@dataclass
class Stack:
    vllm: VllmServer
    agent_url: str
    agent_log: Path
    phoenix: str
    receiver_http: str


def wait_for(url: str, log: Path) -> None:
    """Until the agent answers /health (connection retries back off: 0.5, 1, 2 ... s, about a minute)."""
    try:
        with httpx.Client(transport=httpx.HTTPTransport(retries=8)) as client:
            assert client.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError as exc:
        pytest.fail(f"the agent did not answer ({exc}): {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def stack(phoenix: str, shared_llama: SharedVllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The shared vLLM, the session's Phoenix (tests/conftest.py) and an agent joining between them."""
    work = tmp_path_factory.mktemp("vllm-traces")
    http_port, agent_port, phoenix_url = free_port(), free_port(), phoenix
    agent = None
    # vLLM's spans go to the agent's gRPC receiver while this module holds the port, and the agent
    # starts on a drained ring: only this module's requests meet in its join (shared_vllm.py).
    with shared_llama.borrow_otlp_port() as grpc_port:
        try:
            shared_llama.drain_ring()
            agent_log = work / "agent.log"
            env = {**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "100",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
            with open(agent_log, "wb") as out:
                agent = subprocess.Popen(
                    [sys.executable, "-m", "infersight", "agent", "--ring", shared_llama.ring, "--listen",
                     f"127.0.0.1:{agent_port}", "--poll-interval", "0.05", "--model-name", MODEL,
                     "--otlp-endpoint", phoenix_url, "--otlp-receiver-grpc", f"127.0.0.1:{grpc_port}",
                     "--otlp-receiver", f"127.0.0.1:{http_port}", "--otlp-join-wait", "30"],
                    cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=out)
            agent_url = f"http://127.0.0.1:{agent_port}"
            wait_for(agent_url, agent_log)
            yield Stack(shared_llama.server, agent_url, agent_log, phoenix_url, f"http://127.0.0.1:{http_port}/v1/traces")
        finally:
            if agent is not None:
                agent.terminate()
                try:
                    agent.wait(30)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait()


def call(stack: Stack, operation: str, request_id: str) -> dict[str, Any]:
    headers = {"traceparent": f"00-{TRACE_ID}-{CALLER[operation]}-01", "x-request-id": request_id,
               "x-infersight-task": "code"}
    if operation == "chat":
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": SECRET}]}
    else:
        path, body = "/v1/completions", {"prompt": SECRET}
    resp = httpx.post(stack.vllm.url + path, json={"model": MODEL, "max_tokens": 6, "temperature": 0, **body},
                      headers=headers, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of the agent's exposition (0 when it has no such series)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def test_a_traced_vllm_request_is_one_tree_in_phoenix_without_prompt_text(stack: Stack) -> None:
    junk = httpx.post(stack.receiver_http, content=b"not protobuf", headers={"content-type": "application/x-protobuf"})
    assert junk.status_code == 400  # counted below; the agent keeps joining

    replies = {"text_completion": call(stack, "text_completion", "trace-cmpl-a"),
               "chat": call(stack, "chat", "trace-chat-a")}
    assert replies["text_completion"]["id"] == "cmpl-trace-cmpl-a" and replies["chat"]["id"] == "chatcmpl-trace-chat-a"
    vllm_ids = {"text_completion": "cmpl-trace-cmpl-a-0", "chat": "chatcmpl-trace-chat-a"}  # engine ids (VLLM.md)

    deadline = time.monotonic() + 90
    while True:  # vLLM sends its spans every 0.2 s, the agent joins and exports; Phoenix writes in the background
        spans = [s for s in phoenix_spans(stack.phoenix) if s["context"]["trace_id"] == TRACE_ID]
        roots = {op: [s for s in spans if s["name"] == f"{op} {MODEL}"] for op in CALLER}
        kids = {s["parent_id"] for s in spans if s["name"] in ("queue", "prefill", "decode")}
        if all(len(r) == 1 and r[0]["context"]["span_id"] in kids for r in roots.values()):
            break
        assert time.monotonic() < deadline, (f"spans did not arrive: {[s['name'] for s in spans]}\n"
                                             f"{stack.agent_log.read_text()[-3000:]}")
        time.sleep(0.5)

    assert not [s for s in spans if s["name"] == "llm_request"]  # joined, not also forwarded alone
    assert len(spans) == 2 + sum(1 for s in spans if s["name"] in ("queue", "prefill", "decode"))
    for op, (span,) in roots.items():
        a, usage = span["attributes"], replies[op]["usage"]
        assert span["parent_id"] == CALLER[op] and span["span_kind"] == "LLM"  # under the caller's span
        assert a["gen_ai.request.id"] == vllm_ids[op]                          # vLLM's own span, kept
        assert a["gen_ai.operation.name"] == op and a["gen_ai.request.model"] == MODEL
        assert a["gen_ai.usage.input_tokens"] == a["llm.token_count.prompt"] == usage["prompt_tokens"]
        assert a["gen_ai.usage.output_tokens"] == a["llm.token_count.completion"] == usage["completion_tokens"]
        assert a["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"]       # vLLM's attribute, same number
        assert a["infersight.task"] == "code" and a["infersight.sampling.rule"] == "parent"
        parts = sum(a[f"infersight.{p}_s"] for p in ("queue", "prefill", "preemption_stall", "decode", "network"))
        assert parts == pytest.approx(a["infersight.e2e_s"], abs=1e-6)
        assert json.loads(a["llm.invocation_parameters"])["max_tokens"] == 6
        children = [s for s in spans if s["parent_id"] == span["context"]["span_id"]]
        assert sorted(c["name"] for c in children) == ["decode", "prefill", "queue"]
        for child in children:
            assert ts(span["start_time"]) <= ts(child["start_time"]) <= ts(child["end_time"]) <= ts(span["end_time"])
        assert SECRET not in json.dumps(span) + json.dumps(children)
        assert "input.value" not in a

    exposition = httpx.get(stack.agent_url + "/metrics", timeout=5).text
    assert metric(exposition, "infersight_otlp_request_spans_joined_total") == 2
    assert metric(exposition, "infersight_otlp_request_spans_unjoined_total", side="row") == 0
    assert metric(exposition, "infersight_otlp_request_spans_unjoined_total", side="span") == 0
    assert metric(exposition, "infersight_otlp_receiver_bodies_rejected_total", transport="http",
                  reason="malformed") == 1
    assert metric(exposition, "infersight_otlp_receiver_spans_total", transport="grpc") >= 2
