"""The agent's OTLP receiver and the join of an engine's request spans with the agent's rows.

Senders are the real OpenTelemetry SDK exporters (http/protobuf and gRPC), as vLLM uses them;
what we export is captured with the SDK's InMemorySpanExporter. Rows and events are built by hand
here, so every expected span time and attribute below is worked out from those numbers.
"""
from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pandas as pd
import pytest
from google.rpc.status_pb2 import Status as RpcStatus
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from infersight.correlate.frames import EventFrames
from infersight.tracing.config import TracingConfig
from infersight.tracing.exporter import SpanPipeline
from infersight.tracing.hook import JoinSettings, TracingHook
from infersight.tracing.receiver import OtlpReceiver, ReceiverConfigError, parse_hostport
from infersight.vllm.ids import key_for_vllm_id

MODEL = "tiny-llama"
MS = 1_000_000
CALLER_TRACE, CALLER_SPAN = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
A = 1_700_000_000_000 * MS  # arrival (wall ns: the hook's anchor is left at (0, 0), so to_wall is identity)
S, T, F = A + 2 * MS, A + 7 * MS, A + 27 * MS  # first scheduled, first token, finished


# -- hand-built inputs ------------------------------------------------------------------------------------
def a_row(request_id: int, trace_id: int = 0x1234) -> dict[str, Any]:
    """A request_table row (plus the agent's gpu_seconds and slow_cause) for A/S/T/F above."""
    return {"request_id": request_id, "trace_id": f"{trace_id:032x}", "task": "chat", "prompt_tokens": 40,
            "cached_tokens": 16, "output_tokens": 21, "finish_reason": "length", "num_preemptions": 0,
            "arrival_ns": A, "first_scheduled_ns": S, "first_token_ns": T, "finish_ns": F, "queue_s": 0.002,
            "prefill_s": 0.005, "preemption_stall_s": 0.0, "decode_s": 0.020, "network_s": 0.0, "e2e_s": 0.027,
            "ttft_s": 0.007, "itl_mean_s": 0.001, "gpu_seconds": 0.0, "slow_cause": ""}


def its_events(request_id: int) -> pd.DataFrame:
    """Two prefill chunks: 24 tokens from position 0 over [S, S+3 ms], 16 from 24 over [S+3, S+5 ms]."""
    rows = [(S, S + 3 * MS, 24, 0), (S + 3 * MS, T, 16, 24)]
    return pd.DataFrame([{"ts_ns": ts, "end_ns": end, "request_id": request_id, "trace_id": "", "task": "chat",
                          "event": "PREFILL_CHUNK", "reason": "", "value0": n, "value1": pos}
                         for ts, end, n, pos in rows]).astype(EventFrames().request_events.dtypes.to_dict())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Agent:
    """TracingHook exporting to memory, its SpanJoin on a hand-driven clock, and a receiver in front."""

    def __init__(self, wait_s: float = 10.0, export_content: bool = False) -> None:
        self.memory = InMemorySpanExporter()
        self.clock = Clock()
        self.hook = TracingHook(SpanPipeline.build(self.memory, batch=False), MODEL,
                                join=JoinSettings(wait_s, self.clock))
        self.hook.buffers.step_end[0] = self.hook.buffers.step_end[1] = F  # the steps are all read
        assert self.hook.span_join is not None
        self.join = self.hook.span_join
        self.receiver = OtlpReceiver(self.join.add_spans, ("127.0.0.1", 0), ("127.0.0.1", 0), export_content)
        self.receiver.join_counts = self.join.counts
        self.receiver.start()

    def add_row(self, request_id: int, trace_id: int = 0x1234) -> None:
        self.hook.add_rows(pd.DataFrame([a_row(request_id, trace_id)]), its_events(request_id))
        self.hook.process()

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.memory.get_finished_spans())

    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.receiver.http_port}/v1/traces"


@pytest.fixture
def agent() -> Iterator[Agent]:
    a = Agent()
    yield a
    a.receiver.stop()


def vllm_tracer(endpoint: str, grpc_transport: bool = False) -> tuple[TracerProvider, trace_api.Tracer]:
    """What vLLM sets up: a provider with its resource and a real OTLP exporter (one span per export)."""
    exporter = (GrpcSpanExporter(endpoint=endpoint, insecure=True) if grpc_transport
                else HttpSpanExporter(endpoint=endpoint))
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm", "vllm.process_id": "42"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, provider.get_tracer("vllm.v1.engine.output_processor")


def send_llm_request(tracer: trace_api.Tracer, request_id: str, parent: bool = True,
                     extra: dict[str, Any] | None = None) -> SpanContext:
    """vLLM's llm_request span (output_processor.do_tracing): arrival - 1 ms to finish + 1 ms."""
    context = None
    if parent:
        caller = SpanContext(CALLER_TRACE, CALLER_SPAN, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        context = trace_api.set_span_in_context(NonRecordingSpan(caller))
    span = tracer.start_span("llm_request", context=context, kind=SpanKind.SERVER, start_time=A - MS, attributes={
        "gen_ai.request.id": request_id, "gen_ai.usage.prompt_tokens": 40, "gen_ai.usage.completion_tokens": 21,
        "gen_ai.latency.time_in_queue": 0.002, "gen_ai.request.max_tokens": 21, "gen_ai.request.top_p": 0.9,
        **(extra or {})})
    span.end(end_time=F + MS)
    return span.get_span_context()


def tree(spans: list[ReadableSpan]) -> list[tuple[str, str, str | None, int, int]]:
    """(name, kind, parent's name or the parent span id in hex, start - A, end - A) in start order."""
    by_id = {s.context.span_id: s.name for s in spans}
    out = []
    for s in sorted(spans, key=lambda s: (s.start_time, s.name)):
        parent = None if s.parent is None else by_id.get(s.parent.span_id, f"{s.parent.span_id:016x}")
        out.append((s.name, s.kind.name, parent, s.start_time - A, s.end_time - A))
    return out


# -- transports ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_sdk_exporter_reaches_the_receiver_and_a_joined_tree_comes_out(agent: Agent, transport: str) -> None:
    endpoint = agent.http_url() if transport == "http" else f"127.0.0.1:{agent.receiver.grpc_port}"
    provider, tracer = vllm_tracer(endpoint, transport == "grpc")
    vllm_id = "cmpl-abc123-0"
    sent = send_llm_request(tracer, vllm_id)
    provider.shutdown()
    assert agent.receiver.counts.spans == {"http": 0, "grpc": 0, transport: 1}

    key = key_for_vllm_id(vllm_id)
    agent.add_row(key)
    spans = agent.spans
    assert tree(spans) == [
        (f"text_completion {MODEL}", "SERVER", f"{CALLER_SPAN:016x}", -MS, 27 * MS + MS),
        ("queue", "INTERNAL", f"text_completion {MODEL}", 0, 2 * MS),
        ("prefill", "INTERNAL", f"text_completion {MODEL}", 2 * MS, 5 * MS),
        ("prefill", "INTERNAL", f"text_completion {MODEL}", 5 * MS, 7 * MS),
        ("decode", "INTERNAL", f"text_completion {MODEL}", 7 * MS, 27 * MS),
    ]
    root = next(s for s in spans if s.kind is SpanKind.SERVER)
    # vLLM's ids, so the caller's trace is whole; the caller's parent span is untouched.
    assert (root.context.trace_id, root.context.span_id) == (CALLER_TRACE, sent.span_id)
    assert root.parent.span_id == CALLER_SPAN and root.parent.is_remote
    assert all(s.context.trace_id == CALLER_TRACE for s in spans)
    a = root.attributes
    assert a["gen_ai.request.id"] == vllm_id and a["gen_ai.latency.time_in_queue"] == 0.002  # vLLM's, kept
    assert (a["gen_ai.operation.name"], a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"],
            a["gen_ai.usage.cache_read.input_tokens"], a["llm.token_count.total"]) == \
        ("text_completion", 40, 21, 16, 61)
    assert (a["infersight.request_id"], a["infersight.task"], a["infersight.queue_s"], a["infersight.decode_s"]) == \
        (key, "chat", 0.002, 0.020)
    assert a["openinference.span.kind"] == "LLM" and a["infersight.sampling.rule"] == "parent"
    assert json.loads(a["llm.invocation_parameters"]) == {"max_tokens": 21, "temperature": 0.0, "top_p": 0.9}
    assert [(s.attributes["infersight.prefill.tokens"], s.attributes["infersight.prefill.start_position"])
            for s in spans if s.name == "prefill"] == [(24, 0), (16, 24)]
    c = agent.join.counts
    assert (c.joined, c.span_alone, c.row_alone, c.forwarded) == (1, 0, 0, 0)


def test_row_first_then_span_joins_too_and_a_ring_index_is_ignored(agent: Agent) -> None:
    key = key_for_vllm_id("chatcmpl-xyz")
    agent.add_row((1 << 48) | key)  # the agent's second ring: its ids carry index 1 above bit 48
    assert agent.spans == [] and agent.join.pending == (0, 1)
    provider, tracer = vllm_tracer(agent.http_url())
    sent = send_llm_request(tracer, "chatcmpl-xyz", parent=False)
    provider.shutdown()
    agent.hook.process()
    names = sorted(s.name for s in agent.spans)
    assert names == [f"chat {MODEL}", "decode", "prefill", "prefill", "queue"]
    root = next(s for s in agent.spans if s.kind is SpanKind.SERVER)
    assert root.parent is None  # vLLM's span was a root: so is ours, in vLLM's trace
    assert (root.context.trace_id, root.context.span_id) == (sent.trace_id, sent.span_id)
    assert root.attributes["gen_ai.operation.name"] == "chat" and root.attributes["infersight.sampling.rule"] == "ratio"
    assert agent.join.counts.joined == 1 and agent.join.pending == (0, 0)


def test_a_row_whose_span_never_comes_is_exported_as_ours_after_the_wait(agent: Agent) -> None:
    agent.add_row(7, trace_id=0xABC)
    agent.clock.now += 9.9
    agent.hook.process()
    assert agent.spans == []
    agent.clock.now += 0.1
    agent.hook.process()
    root = next(s for s in agent.spans if s.kind is SpanKind.SERVER)
    assert root.name == f"text_completion {MODEL}" and root.parent is None and root.context.trace_id == 0xABC
    assert (root.start_time, root.end_time) == (A, F)  # our own times: nothing to widen
    assert len(agent.spans) == 5
    assert (agent.join.counts.joined, agent.join.counts.row_alone) == (0, 1)


def test_a_span_whose_row_never_comes_and_other_spans_are_forwarded_as_received(agent: Agent) -> None:
    provider, tracer = vllm_tracer(agent.http_url())
    with tracer.start_as_current_span("vllm.startup", attributes={"code.function": "init_engine"}):
        pass
    assert [s.name for s in agent.spans] == ["vllm.startup"]  # not a request span: forwarded at once
    sent = send_llm_request(tracer, "cmpl-lost-0")
    provider.shutdown()
    agent.hook.process()
    assert len(agent.spans) == 1
    agent.clock.now += 10.0
    agent.hook.process()
    startup, alone = agent.spans
    assert alone.name == "llm_request" and alone.kind is SpanKind.SERVER
    assert (alone.context.trace_id, alone.context.span_id, alone.parent.span_id) == \
        (CALLER_TRACE, sent.span_id, CALLER_SPAN)
    assert (alone.start_time, alone.end_time) == (A - MS, F + MS)
    assert alone.attributes["gen_ai.request.id"] == "cmpl-lost-0"
    for span in (startup, alone):  # vLLM's resource and scope, not ours
        assert span.resource.attributes["service.name"] == "vllm"
        assert span.instrumentation_scope.name == "vllm.v1.engine.output_processor"
    c = agent.join.counts
    assert (c.joined, c.span_alone, c.row_alone, c.forwarded) == (0, 1, 0, 1)


def test_prompt_text_is_dropped_from_received_spans_unless_content_export_is_on() -> None:
    for export_content in (False, True):
        agent = Agent(export_content=export_content)
        try:
            provider, tracer = vllm_tracer(agent.http_url())
            key = key_for_vllm_id("cmpl-p-0")
            send_llm_request(tracer, "cmpl-p-0", extra={"gen_ai.prompt": "SECRET PROMPT", "input.value": "SECRET"})
            provider.shutdown()
            agent.add_row(key)
            root = next(s for s in agent.spans if s.kind is SpanKind.SERVER)
            has = {"gen_ai.prompt", "input.value"} & set(root.attributes)
            assert has == ({"gen_ai.prompt", "input.value"} if export_content else set())
        finally:
            agent.receiver.stop()


def test_flush_lets_out_everything_that_waits(agent: Agent) -> None:
    agent.add_row(9)
    provider, tracer = vllm_tracer(agent.http_url())
    send_llm_request(tracer, "cmpl-other-0")
    provider.shutdown()
    agent.hook.flush()
    assert sorted(s.name for s in agent.spans if s.kind is SpanKind.SERVER) == ["llm_request",
                                                                                f"text_completion {MODEL}"]
    assert (agent.join.counts.span_alone, agent.join.counts.row_alone) == (1, 1)


# -- bad bodies -------------------------------------------------------------------------------------------------
def good_body() -> bytes:
    span = PbSpan(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="ok", start_time_unix_nano=1, end_time_unix_nano=2)
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])]) \
        .SerializeToString()


def post(agent: Agent, body: bytes, content_type: str = "application/x-protobuf", **headers: str) -> httpx.Response:
    return httpx.post(agent.http_url(), content=body, headers={"content-type": content_type, **headers}, timeout=5)


def test_bad_http_bodies_are_answered_counted_and_the_receiver_keeps_serving(agent: Agent,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    good = good_body()
    agent.receiver.max_body_bytes = 10_000
    cases = [(b"not protobuf at all", "application/x-protobuf", {}, 400),
             (good[:-3], "application/x-protobuf", {}, 400),                       # truncated
             (b"\x0a" * 20_000, "application/x-protobuf", {}, 413),                # over the limit
             (gzip.compress(b"\x00" * 50_000), "application/x-protobuf", {"content-encoding": "gzip"}, 413),
             (b"\x1f\x8b garbage", "application/x-protobuf", {"content-encoding": "gzip"}, 400),
             (b"{not json", "application/json", {}, 400),
             (good, "text/plain", {}, 415)]
    for body, media, headers, status in cases:
        resp = post(agent, body, media, **headers)
        assert resp.status_code == status, (body[:20], resp.text)
        if media == "application/x-protobuf":
            assert RpcStatus.FromString(resp.content).code == 3  # INVALID_ARGUMENT, with a message
        elif media == "application/json":
            assert resp.json()["code"] == 3
    rejected = agent.receiver.counts.bodies_rejected
    assert {k: v for k, v in rejected.items() if v} == {("http", "malformed"): 4, ("http", "too_large"): 2,
                                                        ("http", "unsupported_media_type"): 1}
    assert all("Traceback" not in r.getMessage() for r in caplog.records)
    ok = post(agent, good)
    assert ok.status_code == 200
    assert ExportTraceServiceResponse.FromString(ok.content).partial_success.rejected_spans == 0
    assert agent.receiver.counts.spans["http"] == 1 and [s.name for s in agent.spans] == ["ok"]


def test_invalid_spans_are_refused_one_by_one_as_partial_success(agent: Agent) -> None:
    bad = PbSpan(trace_id=b"\x01" * 8, span_id=b"\x02" * 8, name="short trace id")
    zero = PbSpan(trace_id=b"\x00" * 16, span_id=b"\x02" * 8, name="zero trace id")
    good = PbSpan(trace_id=b"\x01" * 16, span_id=b"\x03" * 8, name="fine", start_time_unix_nano=5, end_time_unix_nano=6)
    body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[bad, good, zero])])])
    resp = post(agent, body.SerializeToString())
    assert resp.status_code == 200
    partial = ExportTraceServiceResponse.FromString(resp.content).partial_success
    assert partial.rejected_spans == 2 and "16 non-zero bytes" in partial.error_message
    assert [s.name for s in agent.spans] == ["fine"]
    assert (agent.receiver.counts.spans["http"], agent.receiver.counts.spans_rejected["http"]) == (1, 2)


def test_otlp_json_with_hex_ids_is_read(agent: Agent) -> None:
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]},
                              "scopeSpans": [{"scope": {"name": "s"}, "spans": [{
                                  "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
                                  "parentSpanId": "eee19b7ec3c1b173", "name": "j", "kind": 2,
                                  "startTimeUnixNano": "1544712660000000000", "endTimeUnixNano": "1544712661000000000",
                                  "attributes": [{"key": "n", "value": {"intValue": "3"}}]}]}]}]}
    resp = post(agent, json.dumps(doc).encode(), "application/json")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/json")
    (span,) = agent.spans
    assert (span.context.trace_id, span.context.span_id, span.parent.span_id) == \
        (0x5B8EFFF798038103D269B633813FC60C, 0xEEE19B7EC3C1B174, 0xEEE19B7EC3C1B173)
    assert (span.kind, span.start_time, span.attributes["n"], span.resource.attributes["service.name"]) == \
        (SpanKind.SERVER, 1544712660000000000, 3, "vllm")


def test_bad_grpc_bodies_get_invalid_argument_and_are_counted(agent: Agent) -> None:
    agent.receiver.max_body_bytes = 10_000
    with grpc.insecure_channel(f"127.0.0.1:{agent.receiver.grpc_port}") as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        for body, code in ((b"not protobuf at all", grpc.StatusCode.INVALID_ARGUMENT),
                           (good_body()[:-3], grpc.StatusCode.INVALID_ARGUMENT),
                           (b"\x0a" * 15_000, grpc.StatusCode.RESOURCE_EXHAUSTED)):
            with pytest.raises(grpc.RpcError) as err:
                export(body, timeout=5)
            assert err.value.code() is code
        reply = ExportTraceServiceResponse.FromString(export(good_body(), timeout=5))
    assert reply.partial_success.rejected_spans == 0
    rejected = agent.receiver.counts.bodies_rejected
    assert (rejected[("grpc", "malformed")], rejected[("grpc", "too_large")]) == (2, 1)
    assert agent.receiver.counts.spans["grpc"] == 1


def test_receiver_counters_on_metrics(agent: Agent) -> None:
    from prometheus_client import CollectorRegistry

    post(agent, b"junk")
    post(agent, good_body())
    registry = CollectorRegistry()
    registry.register(agent.receiver.collector())
    get = registry.get_sample_value
    assert get("infersight_otlp_receiver_spans_total", {"transport": "http"}) == 1
    assert get("infersight_otlp_receiver_bodies_rejected_total", {"transport": "http", "reason": "malformed"}) == 1
    assert get("infersight_otlp_request_spans_joined_total") == 0
    assert get("infersight_otlp_request_spans_unjoined_total", {"side": "row"}) == 0


def test_config_refuses_a_receiver_without_an_export_endpoint_and_a_busy_port(agent: Agent) -> None:
    with pytest.raises(ValueError, match="--otlp-endpoint"):
        TracingConfig(otlp_receiver="127.0.0.1:0")
    with pytest.raises(ReceiverConfigError, match="in use"):
        OtlpReceiver(lambda spans: None, ("127.0.0.1", agent.receiver.http_port))
    with pytest.raises(ReceiverConfigError, match="OTLP/gRPC"):
        OtlpReceiver(lambda spans: None, None, ("127.0.0.1", agent.receiver.grpc_port))
    with pytest.raises(ReceiverConfigError, match="HOST:PORT"):
        parse_hostport("nonsense")
    assert parse_hostport(":4318") == ("127.0.0.1", 4318) and parse_hostport("[::1]:4317") == ("::1", 4317)


def test_cli_refuses_a_receiver_without_an_endpoint_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from infersight.cli import main

    assert main(["agent", "--ring", "nothing-here", "--otlp-receiver"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--otlp-endpoint" in err and "Traceback" not in err and len(err.splitlines()) == 1
