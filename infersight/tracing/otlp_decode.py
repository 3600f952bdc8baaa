"""OTLP trace export requests (protobuf or OTLP/JSON bytes) -> SDK ReadableSpans, pure.

The receiver hands the bytes of one `ExportTraceServiceRequest` here and gets back the spans, each
carrying its own resource and instrumentation scope, ready to be joined or forwarded through the
agent's span pipeline as they came. Spans whose ids are not valid (a trace id that is not 16
non-zero bytes, a span id that is not 8) are rejected one by one, as OTLP's partial success asks;
a body that does not parse at all raises OtlpDecodeError (the receiver answers 400).

Sizes are checked before anything is built from them (DecodeLimits): a body with more spans, or
more attribute values in all, than the limits allow is refused whole before one span is made (the
protobuf message is counted with len() on its repeated fields, which allocates nothing); per span,
attributes, events and links beyond the SDK's default limits (128 each) are left out and counted in
`DecodedSpans.truncated`; AnyValues nested deeper than max_value_depth are refused. OTLP/JSON is
refused before json.loads when it holds more containers than max_json_containers, and nesting too
deep for the parsers is a decode error, not a RecursionError.

Two details of the wire format matter here:
- the OpenTelemetry exporters do not put the sampled flag on the wire (`flags` carries only the
  parent's is-remote bits), but every exported span was sampled, so each span is marked sampled;
- OTLP/JSON writes ids as hex, not as the base64 of protobuf's JSON mapping: they are rewritten
  to base64 before protobuf's own JSON parser reads the body.
"""
from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor
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

from infersight.http.inflate import EncodingRefused, decode_body

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \ud800-\udfff: maybe a lone surrogate
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: A span attribute key -> keep it? (the receiver drops prompt and completion text unless asked).
KeyFilter = Callable[[str], bool]


class OtlpDecodeError(ValueError):
    """The body is not an OTLP trace export request (or is compressed wrongly, or too large)."""


class BodyTooLarge(OtlpDecodeError):
    pass


@dataclass(frozen=True)
class DecodeLimits:
    """What one export request may hold. The per-span ones are the SDK's defaults
    (OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT and its siblings); the totals bound the memory one 4 MiB body
    can cost once its spans are Python objects (a few hundred bytes per value, ~2 KB per span)."""

    max_spans: int = 16_384
    max_values: int = 262_144            # attribute values (nested ones included) over the whole request
    max_attributes: int = 128            # per span, event, link, resource and scope
    max_events: int = 128                # per span
    max_links: int = 128                 # per span
    max_value_depth: int = 8             # AnyValue arrays / kvlists inside each other
    max_array_values: int = 4096         # per array or kvlist
    max_json_containers: int = 1_000_000  # '{' and '[' in an OTLP/JSON body (an upper bound, strings too)


DEFAULT_LIMITS = DecodeLimits()


@dataclass
class DecodedSpans:
    """The spans of one export request, in order, and how many were rejected and why."""

    spans: list[ReadableSpan] = field(default_factory=list)
    rejected: int = 0
    error_message: str = ""
    truncated: int = 0  # attributes, events and links left out for the per-span limits

    def response(self) -> ExportTraceServiceResponse:
        """The OTLP response: partial success only when some spans were rejected."""
        out = ExportTraceServiceResponse()
        if self.rejected:
            out.partial_success.rejected_spans = self.rejected
            out.partial_success.error_message = self.error_message
        return out


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """The body, decoded as Content-Encoding says (gzip, every member of it, or deflate), never beyond
    `limit` bytes nor past the work bounds of infersight.http.inflate (the decoder every server shares)."""
    try:
        return decode_body(body, encoding, limit)
    except EncodingRefused as exc:
        raise (BodyTooLarge if exc.status == 413 else OtlpDecodeError)(exc.message) from None


def parse_request(body: bytes, content_type: str, limits: DecodeLimits = DEFAULT_LIMITS) -> ExportTraceServiceRequest:
    """One ExportTraceServiceRequest from protobuf (or OTLP/JSON when content_type says JSON)."""
    if content_type == JSON:
        containers = body.count(b"{") + body.count(b"[")  # C speed, before json.loads builds them
        if containers > limits.max_json_containers:
            raise OtlpDecodeError(f"OTLP/JSON body has {containers} objects and arrays, over the "
                                  f"{limits.max_json_containers} limit")
        try:
            doc = json.loads(body.decode("utf-8"))  # strict: json.loads(bytes) lets raw surrogates through
            if not isinstance(doc, dict):
                raise ValueError("the body is not a JSON object")
            if _SURROGATE_ESCAPE.search(body):  # a lone one cannot go into a protobuf string (upb fails oddly)
                json.dumps(doc, ensure_ascii=False).encode("utf-8")
            _hex_ids_to_base64(doc)
            _check_json_shape(doc, ExportTraceServiceRequest.DESCRIPTOR, "")
            return json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True,
                                         max_recursion_depth=2 * limits.max_value_depth + 12)
        except RecursionError:
            raise OtlpDecodeError("body is not OTLP/JSON: nested too deep") from None
        except (ValueError, TypeError, AttributeError, OverflowError, json_format.ParseError) as exc:  # incl. Unicode
            raise OtlpDecodeError(f"body is not OTLP/JSON: {str(exc)[:200]}") from None
    try:
        return ExportTraceServiceRequest.FromString(body)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise OtlpDecodeError(f"body is not an OTLP protobuf ExportTraceServiceRequest: {str(exc)[:200]}") from None


def _check_json_shape(obj: dict[str, Any], descriptor: Descriptor, where: str) -> None:
    """ValueError naming the first message field whose value is not an object (or, repeated, not a
    list of objects). json_format iterates whatever it is given as the field's object: a 4 MiB string
    there read as four million unknown field names, ~8 s of CPU (18 s under load) for an empty request."""
    for key, value in obj.items():
        fd = descriptor.fields_by_camelcase_name.get(key) or descriptor.fields_by_name.get(key)
        if fd is None or fd.message_type is None or value is None:
            continue  # unknown fields are ignored; scalars are json_format's to check
        items = value if fd.is_repeated else [value]
        if not isinstance(items, list):
            raise ValueError(f"{where}{key}: expected a JSON array, got {type(value).__name__}")
        for i, item in enumerate(items):
            at = f"{where}{key}[{i}]" if fd.is_repeated else f"{where}{key}"
            if not isinstance(item, dict):
                raise ValueError(f"{at}: expected a JSON object, got {type(item).__name__}")
            _check_json_shape(item, fd.message_type, at + ".")


def _items(obj: Any, key: str) -> list[Any]:
    """obj[key] when obj is an object and that is a list (else []: ParseDict will say what is wrong)."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else []


def _hex_ids_to_base64(doc: dict[str, Any]) -> None:
    for rs in _items(doc, "resourceSpans"):
        for ss in _items(rs, "scopeSpans"):
            for span in _items(ss, "spans"):
                _rewrite_ids(span)
                for link in _items(span, "links"):
                    _rewrite_ids(link)


def _rewrite_ids(obj: Any) -> None:
    if not isinstance(obj, dict):
        return
    for key in ("traceId", "spanId", "parentSpanId"):
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise OtlpDecodeError(f"{key} {value[:40]!r} is not hex") from None


def any_value(value: AnyValue, depth: int = 0, limits: DecodeLimits = DEFAULT_LIMITS) -> Any:
    """A protobuf AnyValue as the plain Python value the SDK's encoder writes back the same way."""
    which = value.WhichOneof("value")
    if which in ("array_value", "kvlist_value"):
        if depth >= limits.max_value_depth:
            raise OtlpDecodeError(f"an attribute value is nested deeper than {limits.max_value_depth}")
        if which == "array_value":
            return [any_value(v, depth + 1, limits) for v in value.array_value.values[:limits.max_array_values]]
        return {kv.key: any_value(kv.value, depth + 1, limits)
                for kv in value.kvlist_value.values[:limits.max_array_values]}
    return getattr(value, which) if which else None


def attributes(pairs: Any, keep: KeyFilter | None = None, limits: DecodeLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """KeyValues as a dict, the first max_attributes of them; an empty key (invalid in OTLP) is left
    out, as the SDK would with a warning."""
    return {kv.key: any_value(kv.value, 0, limits) for kv in pairs[:limits.max_attributes]
            if kv.key and (keep is None or keep(kv.key))}


def _values(pairs: Any, limits: DecodeLimits) -> int:
    """Attribute values in KeyValues as attributes() will read them (nested ones counted), allocating
    nothing but the counts; stops counting once over max_values."""
    n = 0
    stack = [(kv.value, 0) for kv in pairs[:limits.max_attributes]]
    while stack and n <= limits.max_values:
        value, depth = stack.pop()
        n += 1
        which = value.WhichOneof("value")
        if which == "array_value" and depth < limits.max_value_depth:
            stack.extend((v, depth + 1) for v in value.array_value.values[:limits.max_array_values])
        elif which == "kvlist_value" and depth < limits.max_value_depth:
            stack.extend((kv.value, depth + 1) for kv in value.kvlist_value.values[:limits.max_array_values])
    return n


def check_sizes(request: ExportTraceServiceRequest, limits: DecodeLimits = DEFAULT_LIMITS) -> None:
    """Refuse (OtlpDecodeError) a request with more spans or attribute values than the limits allow,
    before any span is built; counting stops at the first limit passed."""
    spans = values = 0
    for rs in request.resource_spans:
        values += _values(rs.resource.attributes, limits)
        for ss in rs.scope_spans:
            spans += len(ss.spans)
            if spans > limits.max_spans:
                raise OtlpDecodeError(f"the request has over {limits.max_spans} spans")
            values += _values(ss.scope.attributes, limits)
            for span in ss.spans:
                values += _values(span.attributes, limits)
                for event in span.events[:limits.max_events]:
                    values += _values(event.attributes, limits)
                for link in span.links[:limits.max_links]:
                    values += _values(link.attributes, limits)
                if values > limits.max_values:
                    raise OtlpDecodeError(f"the request has over {limits.max_values} attribute values")


def _is_remote(flags: int) -> bool:
    return bool(flags & SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)


def _context(trace_id: bytes, span_id: bytes, trace_state: str, remote: bool) -> SpanContext:
    state = TraceState.from_header([trace_state]) if trace_state else None
    return SpanContext(int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big"), remote,
                       TraceFlags(TraceFlags.SAMPLED), state)


def _valid_ids(span: PbSpan) -> bool:
    return (len(span.trace_id) == 16 and any(span.trace_id) and len(span.span_id) == 8 and any(span.span_id)
            and len(span.parent_span_id) in (0, 8))


def _scope(pb: PbScope, schema_url: str, limits: DecodeLimits) -> InstrumentationScope:
    return InstrumentationScope(pb.name, pb.version or None, schema_url or None,
                                attributes(pb.attributes, None, limits) or None)


def _over(span: PbSpan, limits: DecodeLimits) -> int:
    """How many of the span's attributes, events and links (and theirs) the limits leave out."""
    n = (max(0, len(span.attributes) - limits.max_attributes) + max(0, len(span.events) - limits.max_events)
         + max(0, len(span.links) - limits.max_links))
    n += sum(max(0, len(e.attributes) - limits.max_attributes) for e in span.events[:limits.max_events])
    return n + sum(max(0, len(li.attributes) - limits.max_attributes) for li in span.links[:limits.max_links])


def decode_spans(request: ExportTraceServiceRequest, keep: KeyFilter | None = None,
                 limits: DecodeLimits = DEFAULT_LIMITS) -> DecodedSpans:
    """The request's spans as ReadableSpans (attribute keys failing `keep` left out, on spans and
    their events); spans with invalid ids are counted in `rejected`, not returned. A request over
    the limits raises OtlpDecodeError before any span is built (check_sizes)."""
    check_sizes(request, limits)
    out = DecodedSpans()
    for rs in request.resource_spans:
        resource = Resource(attributes(rs.resource.attributes, None, limits), rs.schema_url or None)
        for ss in rs.scope_spans:
            scope = _scope(ss.scope, ss.schema_url, limits)
            for span in ss.spans:
                if not _valid_ids(span):
                    out.rejected += 1
                    continue
                out.truncated += _over(span, limits)
                out.spans.append(_span(span, resource, scope, keep, limits))
    if out.rejected:
        out.error_message = f"{out.rejected} spans rejected: trace id must be 16 non-zero bytes, span id 8"
    return out


def _span(span: PbSpan, resource: Resource, scope: InstrumentationScope, keep: KeyFilter | None,
          limits: DecodeLimits = DEFAULT_LIMITS) -> ReadableSpan:
    context = _context(span.trace_id, span.span_id, span.trace_state, False)
    parent = (_context(span.trace_id, span.parent_span_id, "", _is_remote(span.flags))
              if any(span.parent_span_id) else None)
    events = [Event(e.name, attributes(e.attributes, keep, limits), e.time_unix_nano)
              for e in span.events[:limits.max_events]]
    links = [Link(_context(link.trace_id, link.span_id, link.trace_state, _is_remote(link.flags)),
                  attributes(link.attributes, None, limits)) for link in span.links[:limits.max_links]
             if len(link.trace_id) == 16 and len(link.span_id) == 8]
    code = StatusCode(span.status.code) if span.status.code in (0, 1, 2) else StatusCode.UNSET
    # The SDK keeps a description on ERROR only (it warns and drops it otherwise).
    status = Status(code, span.status.message or None) if code is StatusCode.ERROR else Status(code)
    kind = SpanKind(span.kind - 1) if 1 <= span.kind <= 5 else SpanKind.INTERNAL  # proto counts UNSPECIFIED as 0
    return ReadableSpan(span.name, context, parent, resource, attributes(span.attributes, keep, limits), events, links,
                        kind, status=status, start_time=span.start_time_unix_nano, end_time=span.end_time_unix_nano,
                        instrumentation_scope=scope)


def bad_request_status(message: str) -> bytes:
    """A google.rpc.Status (code 3, INVALID_ARGUMENT) body, what OTLP/HTTP answers a bad request with."""
    from google.rpc.status_pb2 import Status as RpcStatus

    return RpcStatus(code=3, message=message).SerializeToString()


__all__ = ["PROTOBUF", "JSON", "OtlpDecodeError", "BodyTooLarge", "DecodeLimits", "DecodedSpans", "inflate",
           "parse_request", "check_sizes", "decode_spans", "any_value", "bad_request_status"]
