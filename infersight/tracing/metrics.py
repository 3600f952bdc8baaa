"""Opt-in OTLP metrics: the GenAI model-server histograms, one observation per finished request.

Names, units and bucket boundaries follow the OpenTelemetry GenAI semantic conventions ("Generative
AI model server metrics"); the boundaries are their advised ExplicitBucketBoundaries. Attributes:
gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.model, gen_ai.response.model, and
error.type on request durations of failed requests. Time to first token and time per output token
are recorded for successful responses only, as the conventions define them.

Every finished request is observed, sampled for spans or not. Exported by the SDK's
PeriodicExportingMetricReader (OTEL_METRIC_EXPORT_INTERVAL, default 60 s) over OTLP.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from infersight.tracing import semconv as sc
from infersight.tracing.exporter import default_resource, resolve_protocol, signal_endpoint

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)

TTFT = "gen_ai.server.time_to_first_token"
TPOT = "gen_ai.server.time_per_output_token"
DURATION = "gen_ai.server.request.duration"


def otlp_metric_reader(endpoint: str | None, protocol: str | None = None,
                       timeout_s: float | None = None) -> MetricReader:
    """A periodic reader over OTLP (endpoint None: the OTEL_EXPORTER_OTLP_* variables); timeout_s: one
    export, retries included (None: the OTEL_EXPORTER_OTLP_*TIMEOUT variables)."""
    given = {"timeout": timeout_s} if timeout_s is not None else {}
    reader_timeout = {"export_timeout_millis": timeout_s * 1000} if timeout_s is not None else {}
    if resolve_protocol(protocol, "metrics") == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter
        except ImportError:
            raise ValueError("OTLP over gRPC needs the opentelemetry-exporter-otlp-proto-grpc package") from None
        return PeriodicExportingMetricReader(GrpcExporter(endpoint=endpoint, **given) if endpoint
                                             else GrpcExporter(**given), **reader_timeout)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    exporter = (OTLPMetricExporter(endpoint=signal_endpoint(endpoint, "metrics"), **given) if endpoint
                else OTLPMetricExporter(**given))
    return PeriodicExportingMetricReader(exporter, **reader_timeout)


class GenAIServerMetrics:
    """The three gen_ai.server.* histograms on a MeterProvider of their own (no global state)."""

    def __init__(self, reader: MetricReader, resource: Resource | None = None) -> None:
        self.provider = MeterProvider(metric_readers=[reader], resource=resource or default_resource(),
                                      shutdown_on_exit=False)  # shutdown() does it, with a deadline
        meter = self.provider.get_meter("infersight.tracing")
        self.ttft = meter.create_histogram(TTFT, unit="s", description="Time to generate first token for successful "
                                           "responses.", explicit_bucket_boundaries_advisory=TTFT_BUCKETS)
        self.tpot = meter.create_histogram(TPOT, unit="s", description="Time per output token generated after the "
                                           "first token for successful responses.",
                                           explicit_bucket_boundaries_advisory=TPOT_BUCKETS)
        self.duration = meter.create_histogram(DURATION, unit="s", description="Generative AI server request "
                                               "duration such as time-to-last byte or last output token.",
                                               explicit_bucket_boundaries_advisory=DURATION_BUCKETS)

    def record(self, row: Mapping[str, Any], operation: str, model: str) -> None:
        """One finished request (a request_table row): e2e is the request duration (to the last byte
        for requests served over HTTP); itl_mean_s is the time per output token after the first."""
        attrs: dict[str, str] = {sc.GEN_AI_OPERATION: operation, sc.GEN_AI_PROVIDER: sc.PROVIDER,
                                 sc.GEN_AI_REQUEST_MODEL: model, sc.GEN_AI_RESPONSE_MODEL: model}
        reason = str(row["finish_reason"])
        if reason in sc.FAILED_REASONS:
            self.duration.record(float(row["e2e_s"]), {**attrs, sc.ERROR_TYPE: reason})
            return
        self.duration.record(float(row["e2e_s"]), attrs)
        ttft = float(row["ttft_s"])
        if not math.isnan(ttft):
            self.ttft.record(ttft, attrs)
        itl = float(row["itl_mean_s"])
        if int(row["output_tokens"]) > 1 and not math.isnan(itl):
            self.tpot.record(itl, attrs)

    def flush(self, timeout_millis: int = 10_000) -> bool:
        return bool(self.provider.force_flush(timeout_millis))

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """A last export, then stop, within timeout_s (what does not make it is the SDK's to log)."""
        self.provider.shutdown(timeout_millis=max(1.0, timeout_s * 1000))
