"""Prometheus families of the vLLM KV event subscriber's own counts (catalogue.VLLM_KV_METRICS).

Built at each scrape from one `VllmKVSubscriber.stats()` snapshot; label values are the bounded
enums of the wire (event types, malformed reasons) and the sequencer (lost reasons).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec

if TYPE_CHECKING:
    from infersight.sources.vllm.kv_events import VllmKVSubscriber


def _counter(spec: MetricSpec, values: dict[str, int] | int) -> CounterMetricFamily:
    fam = CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))
    if isinstance(values, dict):
        for label, value in sorted(values.items()):
            fam.add_metric([label], value)
    else:
        fam.add_metric([], values)
    return fam


class VllmKVCollector(Collector):
    def __init__(self, subscriber: "VllmKVSubscriber") -> None:
        self.subscriber = subscriber

    def collect(self) -> Iterator[Metric]:
        s = self.subscriber.stats()
        yield _counter(C.VLLM_KV_EVENTS, s["events"])
        yield _counter(C.VLLM_KV_BATCHES, s["batches"])
        yield _counter(C.VLLM_KV_GAPS, s["gaps"])
        yield _counter(C.VLLM_KV_REPLAYED, s["replayed"])
        yield _counter(C.VLLM_KV_LOST, s["lost"])
        yield _counter(C.VLLM_KV_MALFORMED, s["malformed"])
        yield _counter(C.VLLM_KV_RESTARTS, s["restarts"])
        yield GaugeMetricFamily(C.VLLM_KV_CACHED.name, C.VLLM_KV_CACHED.help, value=s["cached_blocks"])
        yield _counter(C.VLLM_KV_LEDGER_DROPPED, s["ledger_dropped"])
