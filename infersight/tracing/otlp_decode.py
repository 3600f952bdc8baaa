"""OTLP trace export requests (protobuf or OTLP/JSON bytes) -> SDK ReadableSpans, pure.

The receiver hands the bytes of one `ExportTraceServiceRequest` here and gets back the spans, each
carrying its own resource and instrumentation scope, ready to be joined or forwarded through the
agent's span pipeline as they came. Spans whose ids are not valid (a trace id that is not 16
non-zero bytes, a span id that is not 8) are rejected one by one, as OTLP's partial success asks;
a body that does not parse at all raises OtlpDecodeError (the receiver answers 400).

Two details of the wire format matter here:
- the OpenTelemetry exporters do not put the sampled flag on the wire (`flags` carries only the
  parent's is-remote bits), but every exported span was sampled, so each span is marked sampled;
- OTLP/JSON writes ids as hex, not as the base64 of protobuf's JSON mapping: they are rewritten
  to base64 before protobuf's own JSON parser reads the body.
"""
from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope as PbScope
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan, SpanFlags
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: A span attribute key -> keep it? (the receiver drops prompt and completion text unless asked).
KeyFilter = Callable[[str], bool]


class OtlpDecodeError(ValueError):
    """The body is not an OTLP trace export request (or is compressed wrongly, or too large)."""


class BodyTooLarge(OtlpDecodeError):
    pass


@dataclass
class DecodedSpans:
    """The spans of one export request, in order, and how many were rejected and why."""

    spans: list[ReadableSpan] = field(default_factory=list)
    rejected: int = 0
    error_message: str = ""

    def response(self) -> ExportTraceServiceResponse:
        """The OTLP response: partial success only when some spans were rejected."""
        out = ExportTraceServiceResponse()
        if self.rejected:
            out.partial_success.rejected_spans = self.rejected
            out.partial_success.error_message = self.error_message
        return out


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """The body, gunzipped when Content-Encoding says gzip (or deflate), never beyond `limit` bytes."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise OtlpDecodeError(f"unsupported content-encoding {encoding!r}")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)  # a decompression bomb stops at the limit
    except zlib.error as exc:
        raise OtlpDecodeError(f"body is not valid {encoding}: {exc}") from None
    if len(out) > limit:
        raise BodyTooLarge(f"body inflates beyond {limit} bytes")
    return out


def parse_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """One ExportTraceServiceRequest from protobuf (or OTLP/JSON when content_type says JSON)."""
    if content_type == JSON:
        try:
            doc = json.loads(body)
            if not isinstance(doc, dict):
                raise ValueError("the body is not a JSON object")
            _hex_ids_to_base64(doc)
            return json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True)
        except (ValueError, TypeError, AttributeError, json_format.ParseError) as exc:
            raise OtlpDecodeError(f"body is not OTLP/JSON: {exc}") from None
    try:
        return ExportTraceServiceRequest.FromString(body)
    except (DecodeError, ValueError) as exc:
        raise OtlpDecodeError(f"body is not an OTLP protobuf ExportTraceServiceRequest: {exc}") from None


def _hex_ids_to_base64(doc: dict[str, Any]) -> None:
    for rs in doc.get("resourceSpans") or []:
        for ss in rs.get("scopeSpans") or []:
            for span in ss.get("spans") or []:
                _rewrite_ids(span)
                for link in span.get("links") or []:
                    _rewrite_ids(link)


def _rewrite_ids(obj: dict[str, Any]) -> None:
    for key in ("traceId", "spanId", "parentSpanId"):
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise OtlpDecodeError(f"{key} {value[:40]!r} is not hex") from None


def any_value(value: AnyValue) -> Any:
    """A protobuf AnyValue as the plain Python value the SDK's encoder writes back the same way."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which) if which else None


def attributes(pairs: Any, keep: KeyFilter | None = None) -> dict[str, Any]:
    """KeyValues as a dict; an empty key (invalid in OTLP) is left out, as the SDK would with a warning."""
    return {kv.key: any_value(kv.value) for kv in pairs if kv.key and (keep is None or keep(kv.key))}


def _is_remote(flags: int) -> bool:
    return bool(flags & SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)


def _context(trace_id: bytes, span_id: bytes, trace_state: str, remote: bool) -> SpanContext:
    state = TraceState.from_header([trace_state]) if trace_state else None
    return SpanContext(int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big"), remote,
                       TraceFlags(TraceFlags.SAMPLED), state)


def _valid_ids(span: PbSpan) -> bool:
    return (len(span.trace_id) == 16 and any(span.trace_id) and len(span.span_id) == 8 and any(span.span_id)
            and len(span.parent_span_id) in (0, 8))


def _scope(pb: PbScope, schema_url: str) -> InstrumentationScope:
    return InstrumentationScope(pb.name, pb.version or None, schema_url or None, attributes(pb.attributes) or None)


def decode_spans(request: ExportTraceServiceRequest, keep: KeyFilter | None = None) -> DecodedSpans:
    """The request's spans as ReadableSpans (attribute keys failing `keep` left out, on spans and
    their events); spans with invalid ids are counted in `rejected`, not returned."""
    out = DecodedSpans()
    for rs in request.resource_spans:
        resource = Resource(attributes(rs.resource.attributes), rs.schema_url or None)
        for ss in rs.scope_spans:
            scope = _scope(ss.scope, ss.schema_url)
            for span in ss.spans:
                if not _valid_ids(span):
                    out.rejected += 1
                    continue
                out.spans.append(_span(span, resource, scope, keep))
    if out.rejected:
        out.error_message = f"{out.rejected} spans rejected: trace id must be 16 non-zero bytes, span id 8"
    return out


def _span(span: PbSpan, resource: Resource, scope: InstrumentationScope, keep: KeyFilter | None) -> ReadableSpan:
    context = _context(span.trace_id, span.span_id, span.trace_state, False)
    parent = (_context(span.trace_id, span.parent_span_id, "", _is_remote(span.flags))
              if any(span.parent_span_id) else None)
    events = [Event(e.name, attributes(e.attributes, keep), e.time_unix_nano) for e in span.events]
    links = [Link(_context(link.trace_id, link.span_id, link.trace_state, _is_remote(link.flags)),
                  attributes(link.attributes)) for link in span.links
             if len(link.trace_id) == 16 and len(link.span_id) == 8]
    code = StatusCode(span.status.code) if span.status.code in (0, 1, 2) else StatusCode.UNSET
    # The SDK keeps a description on ERROR only (it warns and drops it otherwise).
    status = Status(code, span.status.message or None) if code is StatusCode.ERROR else Status(code)
    kind = SpanKind(span.kind - 1) if 1 <= span.kind <= 5 else SpanKind.INTERNAL  # proto counts UNSPECIFIED as 0
    return ReadableSpan(span.name, context, parent, resource, attributes(span.attributes, keep), events, links,
                        kind, status=status, start_time=span.start_time_unix_nano, end_time=span.end_time_unix_nano,
                        instrumentation_scope=scope)


def bad_request_status(message: str) -> bytes:
    """A google.rpc.Status (code 3, INVALID_ARGUMENT) body, what OTLP/HTTP answers a bad request with."""
    from google.rpc.status_pb2 import Status as RpcStatus

    return RpcStatus(code=3, message=message).SerializeToString()


__all__ = ["PROTOBUF", "JSON", "OtlpDecodeError", "BodyTooLarge", "DecodedSpans", "inflate", "parse_request",
           "decode_spans", "any_value", "bad_request_status"]
