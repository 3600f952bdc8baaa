"""Fuzzing the OTLP receiver's decode path: seeded mutations of real ExportTraceServiceRequest bodies
(protobuf, OTLP/JSON, gzip'd protobuf), built with the opentelemetry-proto classes, through
`OtlpReceiver.export` (inflate, parse, size checks, decode) and on into the SDK's own OTLP encoder,
as a forwarded span would go. Each body is either refused with OtlpDecodeError, counted once, or
decoded into spans that encode again: never another exception, a hang or an allocation storm.
Hand-made hostile bodies (deep nesting, a flood of tiny spans or attributes) must be refused or
truncated before they cost memory, and a refused body gets HTTP 400 with an OTLP status body.
"""
from __future__ import annotations

import base64
import gzip
import json
from typing import Any

from google.protobuf import json_format
from google.rpc.status_pb2 import Status as RpcStatus
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status
from starlette.testclient import TestClient

from fuzzkit import case_count, check, describe, fuzz, mutations, run_fuzz
from real_inputs import value_mutations
from infersight.tracing import otlp_decode as D
from infersight.tracing.receiver import OtlpReceiver

SEED = 4318
TRACE_ID = bytes(range(1, 17))
#: A case's alarm. The slowest of 10,000 value cases took 0.55 s at load 18 (the same case: 21 ms on its
#: own); at load 28 one passed 2 s. Five, as the file decoders' fuzz tests use.
PER_CASE_S = 5.0


def kv(key: str, value: AnyValue) -> KeyValue:
    return KeyValue(key=key, value=value)


def attributes() -> list[KeyValue]:
    nested = AnyValue(kvlist_value=KeyValueList(values=[kv("inner", AnyValue(array_value=ArrayValue(
        values=[AnyValue(int_value=1), AnyValue(string_value="two")])))]))
    return [kv("gen_ai.request.model", AnyValue(string_value="tiny-moe")), kv("n", AnyValue(int_value=-(2**63))),
            kv("ok", AnyValue(bool_value=True)), kv("ratio", AnyValue(double_value=0.25)),
            kv("raw", AnyValue(bytes_value=b"\x00\xff")), kv("list", AnyValue(array_value=ArrayValue(
                values=[AnyValue(double_value=1.5), AnyValue(double_value=-2.0)]))), kv("map", nested),
            kv("gen_ai.prompt", AnyValue(string_value="secret prompt \u00e9"))]


def span(i: int, parent: int = 0) -> Span:
    s = Span(trace_id=TRACE_ID, span_id=(i + 1).to_bytes(8, "big"), name=f"llm_request {i}", kind=2,
             start_time_unix_nano=1_700_000_000_000_000_000 + i, end_time_unix_nano=1_700_000_000_500_000_000 + i,
             attributes=attributes(), trace_state="vendor=a,other=b", flags=0x300,
             status=Status(code=2, message="boom") if i % 2 else Status(code=1))
    if parent:
        s.parent_span_id = parent.to_bytes(8, "big")
    s.events.add(name="first_token", time_unix_nano=1_700_000_000_100_000_000, attributes=attributes()[:3])
    s.links.add(trace_id=bytes(range(2, 18)), span_id=(99).to_bytes(8, "big"), attributes=attributes()[:2])
    return s


def request(n_spans: int) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for r in range(2):
        rs: ResourceSpans = req.resource_spans.add()
        rs.resource.attributes.extend([kv("service.name", AnyValue(string_value=f"vllm-{r}"))])
        rs.schema_url = "https://opentelemetry.io/schemas/1.26.0"
        ss: ScopeSpans = rs.scope_spans.add()
        ss.scope.name, ss.scope.version = "vllm.llm_engine", "0.32.0"
        ss.spans.extend(span(i, parent=i) for i in range(n_spans))
    return req


def otlp_json(req: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON as the spec writes it: ids as hex, not protobuf-JSON's base64."""
    doc = json_format.MessageToDict(req)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                for obj in [s, *s.get("links", [])]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in obj:
                            obj[key] = base64.b64decode(obj[key]).hex()
    return json.dumps(doc).encode()


PROTO_SEEDS = [request(n).SerializeToString() for n in (1, 3)]
JSON_SEEDS = [otlp_json(request(n)) for n in (1, 2)]
GZIP_SEEDS = [gzip.compress(b, mtime=0) for b in PROTO_SEEDS]


def decoder(media: str, encoding: str = "") -> Any:
    receiver = OtlpReceiver(lambda spans: encode_spans(spans).SerializeToString())  # forwarded: encoded again

    def decode(body: bytes) -> None:
        before = sum(receiver.counts.bodies_rejected.values())
        try:
            decoded = receiver.export(body, media, "http", encoding)
        except D.OtlpDecodeError:
            assert sum(receiver.counts.bodies_rejected.values()) == before + 1  # counted, once
            raise
        assert all(len(s.attributes or {}) <= 128 and len(s.events) <= 128 for s in decoded.spans)
        assert not any(k.startswith("gen_ai.prompt") for s in decoded.spans for k in (s.attributes or {}))

    return decode


def run(media: str, seeds: list[bytes], seed: int, encoding: str = "") -> int:
    cases = mutations(seeds, case_count(), seed)
    check(f"otlp {media} {encoding}".strip(), run_fuzz(decoder(media, encoding), cases, allowed=(D.OtlpDecodeError,),
                                                       per_case_s=PER_CASE_S))
    return len(cases)


def test_seeds_decode_whole() -> None:
    """The unmutated seeds are real requests: every span decodes (the fuzzing starts from valid input)."""
    for media, body, n in ((D.PROTOBUF, PROTO_SEEDS[1], 6), (D.JSON, JSON_SEEDS[1], 4)):
        decoded = D.decode_spans(D.parse_request(body, media))
        assert len(decoded.spans) == n and decoded.rejected == 0
        assert decoded.spans[1].attributes["map"] == {"inner": [1, "two"]}
        assert decoded.spans[1].parent.span_id == 1


def test_fuzz_protobuf_bodies() -> None:
    run(D.PROTOBUF, PROTO_SEEDS, SEED)


def test_fuzz_json_bodies() -> None:
    run(D.JSON, JSON_SEEDS, SEED + 1)


def test_fuzz_json_values() -> None:
    """Structure-aware OTLP/JSON: the seeds' values (ids, times, kinds, attribute values, whole
    containers) replaced by ones wrong for the field, the document still JSON, so the decoder's
    field checks meet them (a byte mutation mostly ends at the JSON parser)."""
    cases = value_mutations(JSON_SEEDS, case_count(), SEED + 3)
    check("otlp application/json values", run_fuzz(decoder(D.JSON), cases, allowed=(D.OtlpDecodeError,),
                                                   per_case_s=PER_CASE_S))


def test_fuzz_gzip_bodies() -> None:
    run(D.PROTOBUF, GZIP_SEEDS, SEED + 2, encoding="gzip")


def deep_value(depth: int) -> AnyValue:
    value = AnyValue(int_value=1)
    for _ in range(depth):
        value = AnyValue(array_value=ArrayValue(values=[value]))
    return value


def hostile_bodies() -> list[tuple[str, bytes, str]]:
    """(media type, body, what must happen: 'refused' or 'truncated')."""
    many_spans = ExportTraceServiceRequest()
    ss = many_spans.resource_spans.add().scope_spans.add()
    ss.spans.extend(Span(trace_id=TRACE_ID, span_id=(i + 1).to_bytes(8, "big")) for i in range(20_000))
    many_attrs = ExportTraceServiceRequest()
    wide = many_attrs.resource_spans.add().scope_spans.add().spans.add(trace_id=TRACE_ID, span_id=b"\x01" * 8)
    wide.attributes.extend(kv(f"k{i}", AnyValue(int_value=i)) for i in range(5_000))
    for i in range(1_000):
        wide.events.add(name=f"e{i}")
    flood = ExportTraceServiceRequest()
    fs = flood.resource_spans.add().scope_spans.add()
    for i in range(2_100):  # 2,100 spans x 128 attributes: over the request's value budget (262,144)
        s = fs.spans.add(trace_id=TRACE_ID, span_id=(i + 1).to_bytes(8, "big"))
        s.attributes.extend(kv(f"a{j}", AnyValue(bool_value=True)) for j in range(128))
    deep = ExportTraceServiceRequest()
    deep.resource_spans.add().scope_spans.add().spans.add(trace_id=TRACE_ID, span_id=b"\x02" * 8).attributes.extend(
        [kv("deep", deep_value(40))])
    return [(D.PROTOBUF, many_spans.SerializeToString(), "refused"),
            (D.PROTOBUF, many_attrs.SerializeToString(), "truncated"),
            (D.PROTOBUF, flood.SerializeToString(), "refused"),
            (D.PROTOBUF, deep.SerializeToString(), "refused"),
            (D.JSON, b"[" * 100_000 + b"]" * 100_000, "refused"),
            # found by the 10,000-case value run: json_format reads a string where an object belongs as
            # that many unknown field names (this one: ~8 s unloaded, 18.7 s at load 8, then accepted)
            (D.JSON, b'{"resourceSpans": [{"resource": "' + b"x" * ((4 << 20) - 100) + b'"}]}', "refused"),
            (D.JSON, b'{"resourceSpans": [' + b"{}," * 1_200_000 + b"{}]}", "refused"),
            (D.JSON, b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 1e999999, "spanId": "zz"}]}]}]}',
             "refused"),
            (D.JSON, b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "' + b"9" * 400
             + b'"}]}]}]}', "refused")]


def test_hostile_bodies_are_refused_or_truncated_before_they_cost_memory() -> None:
    for media, body, expected in hostile_bodies():
        assert len(body) <= 4 << 20, len(body)  # every one fits under the receiver's body limit
        receiver = OtlpReceiver(lambda spans: None)

        def decode(b: bytes, receiver: OtlpReceiver = receiver, media: str = media, expected: str = expected) -> None:
            try:
                decoded = receiver.export(b, media, "http")
            except D.OtlpDecodeError:
                assert expected == "refused"
                return
            assert expected == "truncated" and decoded.truncated == (5_000 - 128) + (1_000 - 128)
            assert len(decoded.spans[0].attributes) == 128 and len(decoded.spans[0].events) == 128

        failures = fuzz(decode, [body], allowed=(), per_case_s=5.0, mem_mb=256)
        assert not failures, f"{expected} {media} {len(body)} bytes: {describe(failures)}"


def test_a_refused_body_gets_400_with_an_otlp_status() -> None:
    receiver = OtlpReceiver(lambda spans: None)
    with TestClient(receiver.app()) as client:
        bad = client.post("/v1/traces", content=PROTO_SEEDS[0][:-7] + b"\xff\xff",
                          headers={"content-type": "application/x-protobuf"})
        assert bad.status_code == 400
        status = RpcStatus.FromString(bad.content)
        assert status.code == 3 and "\n" not in status.message and status.message
        flood = hostile_bodies()[2][1]
        refused = client.post("/v1/traces", content=flood, headers={"content-type": "application/x-protobuf"})
        assert refused.status_code == 400 and "attribute values" in RpcStatus.FromString(refused.content).message
        deep = client.post("/v1/traces", content=b"[" * 100_000, headers={"content-type": "application/json"})
        assert deep.status_code == 400 and deep.json()["code"] == 3
        ok = client.post("/v1/traces", content=JSON_SEEDS[0], headers={"content-type": "application/json"})
        assert ok.status_code == 200
    assert receiver.counts.bodies_rejected[("http", "malformed")] == 3
    assert receiver.counts.spans["http"] == 2
