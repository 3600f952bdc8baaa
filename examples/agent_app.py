"""A small instrumented "agent" that calls `infersight serve` over HTTP with trace context.

The app has its own OpenTelemetry TracerProvider and exports to the same OTLP endpoint as the
infersight agent (the sidecar), so one trace reads:

    invoke_agent demo-agent                 (this app)
    ├── agent.step 0
    │   └── chat <model>          CLIENT    (this app: the LLM call, traceparent injected)
    │       └── chat <model>      SERVER    (the engine request, built by the sidecar)
    │           ├── queue / prefill / decode
    ├── execute_tool word_count             (this app, between the LLM calls)
    └── agent.step 1
        └── chat <model> ...

Run it against a server started with an agent exporting spans, e.g.

    infersight serve --with-agent --otlp-endpoint http://127.0.0.1:6006 &
    python examples/agent_app.py --server http://127.0.0.1:8000 --otlp http://127.0.0.1:6006

It prints one JSON object: the trace id and, per LLM call, the client span id, the engine's request
id, the completion text and the usage the server reported.
"""
from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

QUESTION = "Count the words of a short poem, then say whether the count is even."


def llm_call(tracer: Tracer, client: httpx.Client, model: str, messages: list[dict[str, str]], session: str,
             max_tokens: int) -> dict[str, Any]:
    """One chat completion under a CLIENT span, its context injected as traceparent."""
    with tracer.start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "infersight", "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": max_tokens, "openinference.span.kind": "LLM"}) as span:
        headers = {"x-infersight-task": "chat", "x-infersight-session-id": session}
        TraceContextTextMapPropagator().inject(headers)  # traceparent of this span: the server's parent
        resp = client.post("/v1/chat/completions", headers=headers, json={
            "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0})
        if resp.status_code != 200:
            span.set_status(Status(StatusCode.ERROR, resp.text[:200]))
            resp.raise_for_status()
        body = resp.json()
        use = body["usage"]
        span.set_attributes({"gen_ai.usage.input_tokens": use["prompt_tokens"],
                             "gen_ai.usage.output_tokens": use["completion_tokens"],
                             "gen_ai.response.finish_reasons": [body["choices"][0]["finish_reason"]]})
        return {"span_id": f"{span.get_span_context().span_id:016x}",
                "request_id": int(resp.headers["x-infersight-request-id"]),
                "text": body["choices"][0]["message"]["content"], "usage": use}


def word_count(tracer: Tracer, text: str) -> int:
    """The tool the agent calls between its LLM calls."""
    with tracer.start_as_current_span("execute_tool word_count", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "word_count",
            "openinference.span.kind": "TOOL"}) as span:
        count = len(text.split())
        span.set_attribute("word_count.result", count)
        return count


def run(server: str, otlp: str, model: str, steps: int, max_tokens: int) -> dict[str, Any]:
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-app"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp.rstrip("/") + "/v1/traces")))
    tracer = provider.get_tracer("examples.agent_app")
    session = uuid.uuid4().hex
    calls = []
    try:
        with httpx.Client(base_url=server, timeout=60) as client, tracer.start_as_current_span(
                "invoke_agent demo-agent", attributes={"gen_ai.operation.name": "invoke_agent",
                                                       "gen_ai.agent.name": "demo-agent",
                                                       "openinference.span.kind": "AGENT",
                                                       "session.id": session}) as root:
            messages = [{"role": "system", "content": "You are a terse assistant."},
                        {"role": "user", "content": QUESTION}]
            for step in range(steps):
                with tracer.start_as_current_span(f"agent.step {step}", attributes={"openinference.span.kind": "CHAIN"}):
                    call = llm_call(tracer, client, model, messages, session, max_tokens)
                    calls.append(call)
                    messages.append({"role": "assistant", "content": call["text"]})
                if step < steps - 1:
                    count = word_count(tracer, call["text"])
                    messages.append({"role": "tool", "content": f"word_count: {count}"})
            trace_id = f"{root.get_span_context().trace_id:032x}"
    finally:
        provider.shutdown()  # flushes the batch to the endpoint
    return {"trace_id": trace_id, "session_id": session, "calls": calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8000", help="the infersight serve base URL")
    parser.add_argument("--otlp", default="http://127.0.0.1:4318", help="OTLP/HTTP base URL (traces at /v1/traces)")
    parser.add_argument("--model", default="tiny-moe", help="the served model name")
    parser.add_argument("--steps", type=int, default=2, help="LLM calls (a tool call between each)")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.server, args.otlp, args.model, args.steps, args.max_tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
