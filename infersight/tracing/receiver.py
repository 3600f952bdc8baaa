"""The agent's OTLP trace receiver: an engine (vLLM: `--otlp-traces-endpoint`) sends its spans here.

    OTLP/HTTP  POST /v1/traces (application/x-protobuf or application/json; gzip ok) ─┐
    OTLP/gRPC  opentelemetry.proto.collector.trace.v1.TraceService/Export             ─┴─> decode
                                                                              ─> SpanJoin.add_spans

Each listener binds 127.0.0.1 unless told otherwise, on its own port (not the agent's /metrics
port). A bad body never costs more than its answer and a count: one that does not parse gets
HTTP 400 with a google.rpc.Status body (gRPC: INVALID_ARGUMENT), one over max_body_bytes 413
(RESOURCE_EXHAUSTED), a media type we do not read 415; spans with invalid ids are refused one by
one through OTLP's partial success. Bad bodies are logged at most once a second per reason, with
the count so far. Which spans are joined and which forwarded is span_join.py's business.

This module holds the path every body takes, the HTTP listener, the counts and the lifecycle; the
gRPC listener is receiver_grpc.py, address parsing and binding receiver_address.py (their public
names are re-exported here).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import anyio.to_thread
import uvicorn
from google.protobuf import json_format
from opentelemetry.sdk.trace import ReadableSpan
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infersight.exporters import catalogue as C
from infersight.http.connections import ConnectionGate
from infersight.http.limits import HttpLimits, LimitedApp, grpc_status_error_body, routes_app
from infersight.tracing import otlp_decode as D
from infersight.tracing.receiver_address import ReceiverConfigError, bind_http, parse_hostport
from infersight.tracing.receiver_grpc import GRPC_SERVICE, GrpcListener
from infersight.tracing.config import TracingConfig
from infersight.tracing.span_join import JoinCounts

if TYPE_CHECKING:
    from infersight.tracing.hook import TracingHook

__all__ = ["OtlpReceiver", "ReceiverCounts", "ReceiverConfigError", "parse_hostport", "not_content",
           "GRPC_SERVICE", "MAX_BODY_BYTES", "MEDIA_TYPES", "CONTENT_PREFIXES", "TRANSPORTS", "REASONS"]

log = logging.getLogger("infersight.tracing")
MAX_BODY_BYTES = 4 << 20  # the OpenTelemetry Collector's default gRPC message limit
MEDIA_TYPES = {"application/x-protobuf": D.PROTOBUF, "application/protobuf": D.PROTOBUF, "application/json": D.JSON}
#: Span attribute keys that hold prompt or completion text (dropped unless content export is on).
CONTENT_PREFIXES = ("input.", "output.", "llm.input_messages", "llm.output_messages", "llm.prompts",
                    "gen_ai.prompt", "gen_ai.completion", "gen_ai.input.messages", "gen_ai.output.messages",
                    "gen_ai.system_instructions")
TRANSPORTS = ("http", "grpc")
REASONS = ("malformed", "too_large", "unsupported_media_type", "too_many_connections")
LIMIT_REASONS = {"body_too_large": "too_large", "headers_too_large": "too_large"}  # http.limits' -> ours


def not_content(key: str) -> bool:
    return not key.startswith(CONTENT_PREFIXES)


@dataclass
class ReceiverCounts:
    """Spans accepted, spans refused inside good bodies, and bodies refused, by transport."""

    spans: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TRANSPORTS, 0))
    spans_rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TRANSPORTS, 0))
    bodies_rejected: dict[tuple[str, str], int] = field(
        default_factory=lambda: {(t, r): 0 for t in TRANSPORTS for r in REASONS})
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


class OtlpReceiver:
    """The listeners (either may be off), bound when built so a busy port fails at startup."""

    def __init__(self, sink: Callable[[list[ReadableSpan]], None], http: tuple[str, int] | None = None,
                 grpc_address: tuple[str, int] | None = None, export_content: bool = False,
                 max_body_bytes: int = MAX_BODY_BYTES, max_connections: int = 64) -> None:
        self.sink, self.max_body_bytes = sink, max_body_bytes
        # The HTTP listener's connections; refusals are counted as bodies refused (too_many_connections).
        self.gate = ConnectionGate(max_connections, "otlp_receiver",
                                   on_refuse=lambda: self.reject("http", "too_many_connections", "connection refused"))
        self.keep = None if export_content else not_content
        self.counts = ReceiverCounts()
        self.join_counts: JoinCounts | None = None  # shown beside ours on /metrics (set by attach)
        self._logged: dict[str, float] = {}
        self.http_port = self.grpc_port = None
        self._sock = self._server = self._thread = None
        self._grpc: GrpcListener | None = None
        if http is not None:
            self._sock = bind_http(*http)
            self.http_port = self._sock.getsockname()[1]
            options = self.http_limits().uvicorn_options(grpc_status_error_body, self.gate)
            self._server = uvicorn.Server(uvicorn.Config(self.app(), log_level="warning", access_log=False, **options))
        if grpc_address is not None:
            self._grpc = GrpcListener(lambda body: self.export(body, D.PROTOBUF, "grpc"), *grpc_address,
                                      max_body_bytes=self.max_body_bytes)
            self.grpc_port = self._grpc.port

    @classmethod
    def attach(cls, config: TracingConfig, hook: "TracingHook", max_connections: int = 64) -> "OtlpReceiver":
        """The receiver of `config`, its spans joined with `hook`'s rows (the hook was built with a span
        join: TracingHook.from_config does so when the config has a receiver). max_connections: per listener."""
        join = hook.span_join
        if join is None:
            raise ValueError("the tracing hook has no span join: build it from a config with a receiver")
        http = parse_hostport(config.otlp_receiver) if config.otlp_receiver else None
        grpc_address = parse_hostport(config.otlp_receiver_grpc) if config.otlp_receiver_grpc else None
        receiver = cls(join.add_spans, http, grpc_address, config.export_content,
                       max_connections=max_connections)
        receiver.join_counts = join.counts
        return receiver

    # -- the one path every body takes ------------------------------------------------------------------
    def export(self, body: bytes | None, media_type: str, transport: str, encoding: str = "") -> D.DecodedSpans:
        """Decode one export request (None: a body already known to be too large) and hand its spans
        on; a bad body raises OtlpDecodeError (BodyTooLarge when too large), counted and logged."""
        try:
            if body is None or len(body) > self.max_body_bytes:
                raise D.BodyTooLarge(f"body over the {self.max_body_bytes} byte limit")
            body = D.inflate(body, encoding, self.max_body_bytes)
            decoded = D.decode_spans(D.parse_request(body, media_type), self.keep)
        except D.OtlpDecodeError as exc:
            self.reject(transport, "too_large" if isinstance(exc, D.BodyTooLarge) else "malformed", str(exc))
            raise
        with self.counts.lock:
            self.counts.spans[transport] += len(decoded.spans)
            self.counts.spans_rejected[transport] += decoded.rejected
        if decoded.rejected:
            self._log_once("invalid_span", f"OTLP {transport}: {decoded.error_message}")
        if decoded.truncated:  # the SDK's per-span limits (otlp_decode.DecodeLimits), as the SDK itself would
            self._log_once("truncated", f"OTLP {transport}: {decoded.truncated} attributes, events or links over "
                           "the per-span limits left out")
        if decoded.spans:
            try:
                self.sink(decoded.spans)
            except Exception as exc:  # noqa: BLE001 -- a bug of ours must not turn into the sender's retries
                log.error("OTLP %s: %d received spans could not be handed on: %s: %s", transport,
                          len(decoded.spans), type(exc).__name__, exc)
        return decoded

    def reject(self, transport: str, reason: str, message: str) -> None:
        with self.counts.lock:
            self.counts.bodies_rejected[(transport, reason)] += 1
            n = self.counts.bodies_rejected[(transport, reason)]
        self._log_once(reason, f"OTLP {transport} body refused ({reason}, {n} so far): {message[:200]}")

    def _log_once(self, reason: str, line: str) -> None:
        now = time.monotonic()
        if now - self._logged.get(reason, -1e9) >= 1.0:  # a flood of bad bodies costs one line a second
            self._logged[reason] = now
            log.warning("%s", line)

    # -- OTLP/HTTP ------------------------------------------------------------------------------------------
    def app(self) -> LimitedApp:
        async def traces(request: Request) -> Response:
            media = MEDIA_TYPES.get(request.headers.get("content-type", "").split(";")[0].strip().lower())
            if media is None:
                self.reject("http", "unsupported_media_type", request.headers.get("content-type", "(none)"))
                return _http_error(415, "use application/x-protobuf or application/json", D.PROTOBUF)
            body = await _read_limited(request, self.max_body_bytes)
            try:  # inflating and decoding a body is CPU work: in a worker thread, off the event loop
                decoded = await anyio.to_thread.run_sync(self.export, body, media, "http",
                                                         request.headers.get("content-encoding", ""))
            except D.BodyTooLarge as exc:
                return _http_error(413, str(exc), media)
            except D.OtlpDecodeError as exc:
                return _http_error(400, str(exc), media)
            response = decoded.response()
            if media == D.JSON:
                return Response(json_format.MessageToJson(response, indent=None), media_type=D.JSON)
            return Response(response.SerializeToString(), media_type=D.PROTOBUF)

        app = routes_app([Route("/v1/traces", traces, methods=["POST"])])
        return LimitedApp(app, self.http_limits(), grpc_status_error_body,
                          lambda reason, message: self.reject("http", LIMIT_REASONS.get(reason, "malformed"), message))

    def http_limits(self) -> HttpLimits:
        """infersight.http.limits on the HTTP listener: bodies up to twice max_body_bytes reach the
        handler (its 413 is a Status in the sender's encoding); JSON nested past protobuf's own
        recursion limit (100) is refused before it is parsed."""
        return HttpLimits(max_body_bytes=2 * self.max_body_bytes, max_json_depth=100,
                          max_connections=self.gate.max_connections)

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._server is not None:
            self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True,
                                            name="infersight-otlp-http")
            self._thread.start()
            deadline = time.monotonic() + 10
            while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)  # serving before start() returns: the engine may send at once
            log.info("receiving OTLP/HTTP traces on http://%s:%d/v1/traces", *self._sock.getsockname()[:2])
        if self._grpc is not None:
            self._grpc.start()
            log.info("receiving OTLP/gRPC traces on port %d", self.grpc_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._sock.close()
        if self._grpc is not None:
            self._grpc.stop()

    def collector(self) -> Collector:
        return _ReceiverCollector(self)


async def _read_limited(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is known to be over `limit` (never read beyond it)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _http_error(status: int, message: str, media: str) -> Response:
    if media == D.JSON:
        return Response(json.dumps({"code": 3, "message": message}), status, media_type=D.JSON)
    return Response(D.bad_request_status(message), status, media_type=D.PROTOBUF)


class _ReceiverCollector(Collector):
    """The receiver's and the join's counters on the agent's /metrics (OTLP_RECEIVER_METRICS)."""

    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def collect(self) -> Iterator[Metric]:
        counts = self.receiver.counts
        with counts.lock:
            spans, rejected, bodies = dict(counts.spans), dict(counts.spans_rejected), dict(counts.bodies_rejected)
        for spec, values in ((C.OTLP_RECEIVER_SPANS, spans), (C.OTLP_RECEIVER_SPANS_REJECTED, rejected)):
            fam = CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))
            for transport, n in sorted(values.items()):
                fam.add_metric([transport], n)
            yield fam
        fam = CounterMetricFamily(C.OTLP_RECEIVER_BODIES_REJECTED.name, C.OTLP_RECEIVER_BODIES_REJECTED.help,
                                  labels=list(C.OTLP_RECEIVER_BODIES_REJECTED.labels))
        for (transport, reason), n in sorted(bodies.items()):
            fam.add_metric([transport, reason], n)
        yield fam
        join = self.receiver.join_counts or JoinCounts()
        yield CounterMetricFamily(C.OTLP_REQUEST_SPANS_JOINED.name, C.OTLP_REQUEST_SPANS_JOINED.help, value=join.joined)
        fam = CounterMetricFamily(C.OTLP_REQUEST_SPANS_UNJOINED.name, C.OTLP_REQUEST_SPANS_UNJOINED.help,
                                  labels=list(C.OTLP_REQUEST_SPANS_UNJOINED.labels))
        fam.add_metric(["span"], join.span_alone)
        fam.add_metric(["row"], join.row_alone)
        yield fam
