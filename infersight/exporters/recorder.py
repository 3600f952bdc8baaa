"""Prometheus exposition of the flight recorder's gauges (its counters are in the agent's state and
rendered with the rest). A protocol, so that exporters never import the agent."""
from __future__ import annotations

from typing import Iterator, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infersight.exporters.catalogue import MetricSpec


class RecorderGauges(Protocol):
    def gauge_rows(self) -> list[tuple[MetricSpec, list[tuple[list[str], float]]]]: ...


class RecorderCollector(Collector):
    """Builds the recorder's gauge families at each scrape."""

    def __init__(self, recorder: RecorderGauges) -> None:
        self.recorder = recorder

    def collect(self) -> Iterator[Metric]:
        for spec, rows in self.recorder.gauge_rows():
            fam = GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))
            for labels, value in rows:
                fam.add_metric(labels, value)
            yield fam
