"""The agent's ring discovery on /metrics: rings held by another agent now, how often one was
passed over (probes.ring_discovery.RingDiscovery), and rings whose writer died (agent.rings.ingest)."""
from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infersight.exporters import catalogue as C
from infersight.probes.ring_discovery import RingDiscovery


class DiscoveryCollector(Collector):
    """PROBE_RINGS_HELD, PROBE_RING_ATTACH_SKIPPED and PROBE_RINGS_DEAD of one RingDiscovery, read at
    each scrape."""

    def __init__(self, discovery: RingDiscovery) -> None:  # noqa: D107
        self.discovery = discovery

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(C.PROBE_RINGS_HELD.name, C.PROBE_RINGS_HELD.help, value=self.discovery.held)
        yield CounterMetricFamily(C.PROBE_RING_ATTACH_SKIPPED.name, C.PROBE_RING_ATTACH_SKIPPED.help,
                                  value=self.discovery.skipped)
        yield CounterMetricFamily(C.PROBE_RINGS_DEAD.name, C.PROBE_RINGS_DEAD.help, value=self.discovery.dead)
