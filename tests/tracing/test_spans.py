"""Spans built by the agent from a real server's probe events, exported to memory: their place in the
caller's trace, timing, GenAI / OpenInference / Langfuse attributes, step links, and content
redaction."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import httpx
import pytest
from opentelemetry.trace import SpanKind, StatusCode
from serve_fixtures import MODEL, Harness, real_server
from tracing_fixtures import AgentSide

from infersight.serve.config import ServeConfig

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
PROMPT = "def fibonacci(n):"


def call(h: Harness, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    async def go() -> Any:
        async with h.client() as c:
            return await c.post(path, json=body, headers=headers or {})
    resp = asyncio.run(go())
    assert resp.status_code == 200, resp.text
    return resp


@pytest.fixture(scope="module")
def traced() -> tuple[AgentSide, dict[str, Any]]:
    """One completion from a traced caller, one streamed chat without trace context."""
    with Harness(ServeConfig(model_name=MODEL)) as h:
        comp = call(h, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0.7, "top_p": 0.9,
                                            "seed": 1, "ignore_eos": True},
                    {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01", "tracestate": "vendor=abc",
                     "x-infersight-task": "code", "x-infersight-session-id": "sess-1", "x-infersight-user-id": "u-1"})
        chat = call(h, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello there"}],
                                                 "max_tokens": 4, "stream": True, "ignore_eos": True, "user": "bob"})
        h.wait_idle()
        side = AgentSide()
        side.poll(h)
        return side, {"completion": comp.json(), "chat_trace": chat.headers["x-infersight-trace-id"]}


def by_trace(side: AgentSide, trace_hex: str) -> Any:
    return next(s for s in side.request_spans() if s.context.trace_id == int(trace_hex, 16))


def test_request_span_is_the_callers_child(traced: tuple[AgentSide, dict[str, Any]]) -> None:
    side, _ = traced
    span = by_trace(side, TRACE_ID)
    assert span.name == f"text_completion {MODEL}" and span.kind is SpanKind.SERVER
    assert span.parent is not None and span.parent.span_id == int(CALLER_SPAN, 16) and span.parent.is_remote
    assert span.context.trace_state.get("vendor") == "abc"


def test_untraced_request_keeps_the_engine_trace_id(traced: tuple[AgentSide, dict[str, Any]]) -> None:
    side, info = traced
    span = by_trace(side, info["chat_trace"])
    assert span.name == f"chat {MODEL}" and span.parent is None
    assert span.attributes["gen_ai.request.stream"] is True and span.attributes["user.id"] == "bob"


def test_genai_openinference_langfuse_attributes(traced: tuple[AgentSide, dict[str, Any]]) -> None:
    side, info = traced
    a = by_trace(side, TRACE_ID).attributes
    usage = info["completion"]["usage"]
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.provider.name"] == "infersight"
    assert a["gen_ai.request.model"] == MODEL and a["gen_ai.response.model"] == MODEL
    assert (a["gen_ai.request.temperature"], a["gen_ai.request.top_p"], a["gen_ai.request.max_tokens"],
            a["gen_ai.request.seed"]) == (0.7, 0.9, 6, 1)
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"] == len(PROMPT) + 1
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 6
    assert a["gen_ai.usage.cache_read.input_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("length",)
    assert a["openinference.span.kind"] == "LLM" and a["llm.model_name"] == MODEL
    assert (a["llm.token_count.prompt"], a["llm.token_count.completion"], a["llm.token_count.total"]) == (
        usage["prompt_tokens"], 6, usage["total_tokens"])
    assert a["llm.token_count.prompt_details.cache_read"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert json.loads(a["llm.invocation_parameters"]) == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 6,
                                                          "seed": 1, "stream": False}
    assert a["session.id"] == "sess-1" and a["user.id"] == "u-1"
    assert a["infersight.task"] == "code" and a["infersight.preemptions"] == 0
    for key in ("infersight.ttft_s", "infersight.queue_s", "infersight.prefill_s", "infersight.decode_s",
                "infersight.network_s", "infersight.engine_seconds"):
        assert a[key] >= 0, key
    # A CPU run: no GPU measured anything, so no GPU figure is on the span (absent, not 0).
    assert not {"infersight.energy_j", "infersight.gpu_sm_active_s", "infersight.gpu_kernel_s"} & set(a)
    assert a["infersight.network_s"] > 0  # the NETWORK record made it into the decomposition


def test_children_and_timing(traced: tuple[AgentSide, dict[str, Any]]) -> None:
    side, _ = traced
    span = by_trace(side, TRACE_ID)
    kids = side.children(span)
    names = [k.name for k in kids]
    assert names[0] == "queue" and names[-1] == "decode" and "prefill" in names
    assert set(names) == {"queue", "prefill", "decode"}
    for k in kids:
        assert span.start_time <= k.start_time <= k.end_time <= span.end_time, k.name
    decode = kids[-1]
    first_token = next(e for e in span.events if e.name == "first_token")
    assert first_token.timestamp == decode.start_time
    completion_start = dt.datetime.fromisoformat(span.attributes["langfuse.observation.completion_start_time"]
                                                 .replace("Z", "+00:00"))
    assert abs(completion_start.timestamp() * 1e9 - decode.start_time) < 2_000  # microsecond precision
    prefill_tokens = sum(k.attributes["infersight.prefill.tokens"] for k in kids if k.name == "prefill")
    assert prefill_tokens == span.attributes["gen_ai.usage.input_tokens"]
    # Wall-clock: within a few seconds of now (the ring's anchor converted the monotonic times).
    assert abs(span.start_time / 1e9 - dt.datetime.now().timestamp()) < 120


def test_step_spans_are_linked_from_request_spans(traced: tuple[AgentSide, dict[str, Any]]) -> None:
    side, _ = traced
    steps = {s.context.span_id: s for s in side.named("engine.step")}
    assert steps
    for span in side.request_spans():
        assert span.links, span.name
        for link in span.links:
            step = steps[link.context.span_id]
            assert step.context.trace_id == link.context.trace_id != span.context.trace_id
            assert step.parent is None and link.attributes["infersight.step.tokens"] > 0
            assert span.start_time <= step.start_time and step.end_time <= span.end_time
    assert len({s.context.trace_id for s in steps.values()}) == len(steps)  # each step its own trace


def test_no_content_by_default(traced: tuple[AgentSide, dict[str, Any]]) -> None:
    side, _ = traced
    for span in side.spans:
        attrs = dict(span.attributes or {})
        assert not {"input.value", "output.value"} & set(attrs)
        assert not any(isinstance(v, str) and (PROMPT in v or "hello there" in v) for v in attrs.values())


@pytest.mark.parametrize("server_exports, agent_exports", [(True, True), (True, False), (False, True)])
def test_content_needs_both_ends(server_exports: bool, agent_exports: bool) -> None:
    with Harness(ServeConfig(model_name=MODEL, export_content=server_exports)) as h:
        comp = call(h, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "ignore_eos": True})
        call(h, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3})
        h.wait_idle()
        side = AgentSide(export_content=agent_exports)
        side.poll(h)
    spans = {s.attributes["gen_ai.operation.name"]: s.attributes for s in side.request_spans()}
    if server_exports and agent_exports:
        assert spans["text_completion"]["input.value"] == PROMPT
        assert spans["text_completion"]["output.value"] == comp.json()["choices"][0]["text"]
        assert spans["chat"]["llm.input_messages.0.message.content"] == "hello there"
        assert spans["chat"]["input.mime_type"] == "application/json"
        assert spans["chat"]["llm.output_messages.0.message.role"] == "assistant"
    else:
        assert all("input.value" not in a and "output.value" not in a for a in spans.values())


def test_failed_request_has_error_status() -> None:
    """A client that goes away mid-stream aborts its request: the span is kept and marked failed."""
    with Harness(ServeConfig(model_name=MODEL)) as h, real_server(h) as url:
        with httpx.stream("POST", url + "/v1/completions", timeout=30, json={
                "prompt": "abort me", "max_tokens": 200, "ignore_eos": True, "stream": True}) as resp:
            next(resp.iter_lines())  # one chunk, then hang up
        h.wait_idle()
        side = AgentSide(ratio=0.0)
        side.poll(h)
    (span,) = side.request_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "abort" and span.attributes["infersight.sampling.rule"] == "failed"
    assert span.attributes["gen_ai.usage.output_tokens"] < 200
    assert span.attributes["infersight.network_s"] >= 0  # the last byte went out before the abort
