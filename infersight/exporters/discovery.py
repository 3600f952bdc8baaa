"""The agent's ring discovery on /metrics: rings held by another agent now, and how often one was
passed over (probes.ring_discovery.RingDiscovery)."""
from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infersight.exporters import catalogue as C
from infersight.probes.ring_discovery import RingDiscovery


class DiscoveryCollector(Collector):
    """PROBE_RINGS_HELD and PROBE_RING_ATTACH_SKIPPED of one RingDiscovery, read at each scrape."""

    def __init__(self, discovery: RingDiscovery) -> None:  # noqa: D107
        self.discovery = discovery

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(C.PROBE_RINGS_HELD.name, C.PROBE_RINGS_HELD.help, value=self.discovery.held)
        yield CounterMetricFamily(C.PROBE_RING_ATTACH_SKIPPED.name, C.PROBE_RING_ATTACH_SKIPPED.help,
                                  value=self.discovery.skipped)
