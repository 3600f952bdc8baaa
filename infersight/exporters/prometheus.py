"""Prometheus exposition of the agent's state: one custom collector, families built at scrape.

Every family comes from a catalogue entry, so names, help, units and label names are never
typed here. The agent owns its registry (no global default registry, nothing registered at
import). With vllm_compat, the subset we can honestly provide is also served under vLLM's names.
"""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Iterator, Mapping, Protocol

import numpy as np
import pandas as pd

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar as PromExemplar

from infersight.exporters.aggregates import LabelledCounter, LabelledHistogram
from infersight.correlate import moe, spec_speedup
from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.exporters.target_info import TargetInfoCollector
from infersight.gpu.exposition import gpu_metric_families

if TYPE_CHECKING:
    from infersight.gpu.sampler import GpuSampler


class ExpositionSettings(Protocol):
    """What the collector reads of the agent's config."""

    exposition: ExpositionConfig


class MetricSource(Protocol):
    """What the collector reads (the agent's state provides it); held under ``lock`` while read.
    A protocol, so that exporters never import the agent: data flows agent -> exporters."""

    lock: threading.Lock
    config: ExpositionSettings
    counters: dict[str, LabelledCounter]
    histograms: dict[str, LabelledHistogram]
    last_step: dict[str, int]
    expert_tokens: np.ndarray
    spec_events: pd.DataFrame
    spec_step_timing: pd.DataFrame
    ring_stats: dict[str, dict[str, int]]


def _counter(spec: MetricSpec, data: LabelledCounter, name: str | None = None,
             extra: tuple[tuple[str, str], ...] = ()) -> CounterMetricFamily:
    fam = CounterMetricFamily(name or spec.name, spec.help, labels=[*spec.labels, *(k for k, _ in extra)])
    for labels, value in sorted(data.values.items()):
        fam.add_metric([*labels, *(v for _, v in extra)], value)
    return fam


def _histogram(spec: MetricSpec, data: LabelledHistogram, name: str | None = None,
               extra: tuple[tuple[str, str], ...] = ()) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name or spec.name, spec.help, labels=[*spec.labels, *(k for k, _ in extra)],
                                unit="" if name else spec.unit)
    for labels in sorted(data.series):
        buckets = []
        for le, count, ex in data.cumulative(labels):
            if ex is not None:
                buckets.append((le, count, PromExemplar({"trace_id": ex.trace_id}, ex.value, ex.timestamp)))
            else:
                buckets.append((le, count))
        fam.add_metric([*labels, *(v for _, v in extra)], buckets, data.series[labels].sum)
    return fam


def _gauge(spec: MetricSpec, rows: list[tuple[list[str], float]], name: str | None = None,
           extra: tuple[tuple[str, str], ...] = ()) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name or spec.name, spec.help, labels=[*spec.labels, *(k for k, _ in extra)])
    for labels, value in rows:
        fam.add_metric([*labels, *(v for _, v in extra)], value)
    return fam


def identity_values(spec: MetricSpec, values: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The (label, value) pairs a family of `spec` is served with after its own labels: its identity
    labels (catalogue.identity), valued from the agent's `values` (model_name: the served model)."""
    return tuple((label, values[label]) for label in spec.identity_labels)


class AgentCollector(Collector):
    def __init__(self, state: MetricSource, gpu: "GpuSampler | None" = None) -> None:
        self.state = state
        self.gpu = gpu
        self.identity = {C.MODEL_LABEL: state.config.exposition.model_name}  # the engine families' identity labels

    def _id(self, spec: MetricSpec) -> tuple[tuple[str, str], ...]:
        return identity_values(spec, self.identity)

    def collect(self) -> Iterator[Metric]:
        state, cfg = self.state, self.state.config.exposition
        with state.lock:
            for spec in C.CATALOGUE:
                if spec in C.GPU_METRICS:  # rendered from the sampler by gpu_metric_families
                    continue
                if spec.kind == "counter" and spec.name not in (C.EXPERT_TOKENS.name, C.PROBE_EVENTS.name,
                                                               C.PROBE_DROPPED.name, C.PROBE_CORRUPT.name,
                                                               C.PROBE_LOST.name):
                    yield _counter(spec, state.counters[spec.name], extra=self._id(spec))
                elif spec.kind == "histogram":
                    yield _histogram(spec, state.histograms[spec.name], extra=self._id(spec))
            yield from self._engine_gauges()
            yield from self._moe(cfg.max_expert_series, cfg.top_hot_pairs)
            yield from self._spec_gauges()
            yield from self._probe_counters()
            if cfg.vllm_compat:
                yield from self._vllm(cfg.model_name)
        if self.gpu is not None:  # the sampler has its own lock
            yield from gpu_metric_families(self.gpu)

    def _engine_gauges(self) -> Iterator[Metric]:
        last = self.state.last_step
        if not last:
            return
        yield _gauge(C.REQUESTS_RUNNING, [([], last["running"])], extra=self._id(C.REQUESTS_RUNNING))
        yield _gauge(C.REQUESTS_WAITING, [([], last["waiting"])], extra=self._id(C.REQUESTS_WAITING))
        yield _gauge(C.REQUESTS_SWAPPED, [([], last["swapped"])], extra=self._id(C.REQUESTS_SWAPPED))
        total, used, cached = last["kv_blocks_total"], last["kv_blocks_in_use"], last["kv_blocks_cached"]
        yield _gauge(C.KV_BLOCKS, [(["in_use"], used), (["cached"], cached), (["free"], total - used - cached)],
                     extra=self._id(C.KV_BLOCKS))
        yield _gauge(C.KV_USAGE, [([], used / total if total else 0.0)], extra=self._id(C.KV_USAGE))

    def _moe(self, cap: int, top_n: int) -> Iterator[Metric]:
        m = self.state.expert_tokens
        if m.size == 0:
            return
        ident = self._id(C.EXPERT_TOKENS)
        fam = CounterMetricFamily(C.EXPERT_TOKENS.name, C.EXPERT_TOKENS.help,
                                  labels=[*C.EXPERT_TOKENS.labels, *(k for k, _ in ident)])
        values = [v for _, v in ident]
        if m.size <= cap:
            for (layer, expert), v in zip(((l, e) for l in range(m.shape[0]) for e in range(m.shape[1])), m.ravel()):
                fam.add_metric([str(layer), str(expert), *values], float(v))
        else:
            for expert, v in enumerate(m.sum(axis=0)):
                fam.add_metric(["all", str(expert), *values], float(v))
        # The hottest pairs under the cap too: the dashboards read them from this one gauge (top_n
        # series), whichever shape the expert counter has.
        top = moe.top_pairs(moe.matrix_frame(self.state.expert_tokens), top_n)
        yield _gauge(C.HOT_EXPERT_TOKENS, [([str(r.layer), str(r.expert)], float(r.tokens))
                                           for r in top.itertuples(index=False)], extra=self._id(C.HOT_EXPERT_TOKENS))
        yield fam
        imb = moe.layer_imbalance(moe.matrix_frame(self.state.expert_tokens))
        rows = []
        for r in imb.itertuples(index=False):
            for stat in ("max_over_mean", "cv", "hot_cold_ratio"):
                rows.append(([str(r.layer), stat], float(getattr(r, stat))))
        yield _gauge(C.MOE_IMBALANCE, rows, extra=self._id(C.MOE_IMBALANCE))

    def _spec_gauges(self) -> Iterator[Metric]:
        by_task = spec_speedup.speedup_by_task(self.state.spec_events, self.state.spec_step_timing)
        if by_task.empty:
            return
        yield _gauge(C.SPEC_PREDICTED_SPEEDUP, [([str(r.task)], float(r.predicted_speedup))
                                                for r in by_task.itertuples(index=False) if r.basis == spec_speedup.PREDICTED],
                     extra=self._id(C.SPEC_PREDICTED_SPEEDUP))
        yield _gauge(C.SPEC_ACCEPT_RATE, [([str(r.task)], float(r.accept_rate)) for r in by_task.itertuples(index=False)],
                     extra=self._id(C.SPEC_ACCEPT_RATE))

    def _probe_counters(self) -> Iterator[Metric]:
        for spec, key in ((C.PROBE_EVENTS, "produced"), (C.PROBE_DROPPED, "dropped"), (C.PROBE_CORRUPT, "corrupt"),
                          (C.PROBE_LOST, "reader_lost")):
            data = LabelledCounter()
            for ring, stats in self.state.ring_stats.items():
                data.inc((ring,), stats.get(key, 0))
            yield _counter(spec, data, extra=self._id(spec))

    def _vllm(self, model: str) -> Iterator[Metric]:
        """vLLM names for dashboards that already query them: same numbers, vLLM's label model_name."""
        extra = (("model_name", model),)
        for spec in (C.TTFT, C.ITL, C.E2E):
            merged = LabelledHistogram(spec.buckets or ())
            for labels, series in self.state.histograms[spec.name].series.items():
                mine = merged.series.setdefault((), type(series)(series.counts * 0))
                mine.counts += series.counts
                mine.sum += series.sum
            # merged over tasks: model_name is its only label (not spec.labels, which would take the value)
            yield _histogram(replace(spec, labels=()), merged, name=spec.vllm_name, extra=extra)
        for spec in (C.PROMPT_TOKENS, C.GENERATION_TOKENS, C.PREEMPTIONS, C.PREFIX_QUERIED, C.PREFIX_HIT,
                     C.SPEC_DRAFT, C.SPEC_ACCEPTED):
            total = LabelledCounter()
            total.inc((), self.state.counters[spec.name].total())
            fam = CounterMetricFamily(spec.vllm_name or spec.name, spec.help, labels=["model_name"])
            fam.add_metric([model], total.get(()))
            yield fam
        fam = CounterMetricFamily(C.REQUESTS.vllm_name or C.REQUESTS.name, C.REQUESTS.help,
                                  labels=["finished_reason", "model_name"])
        by_reason: dict[str, float] = {}
        for (_, reason), value in self.state.counters[C.REQUESTS.name].values.items():
            by_reason[reason] = by_reason.get(reason, 0.0) + value
        for reason, value in sorted(by_reason.items()):
            fam.add_metric([reason, model], value)
        yield fam
        last = self.state.last_step
        if last:
            for spec, value in ((C.REQUESTS_RUNNING, last["running"]), (C.REQUESTS_WAITING, last["waiting"]),
                                (C.KV_USAGE, last["kv_blocks_in_use"] / max(1, last["kv_blocks_total"]))):
                fam = GaugeMetricFamily(spec.vllm_name or spec.name, spec.help, labels=["model_name"])
                fam.add_metric([model], value)
                yield fam


def build_registry(state: MetricSource, gpu: "GpuSampler | None" = None,
                   resource_attributes: Mapping[str, object] | None = None) -> CollectorRegistry:
    """resource_attributes: the agent's OpenTelemetry resource (tracing.identity), served as target_info
    before everything else (None: no target_info, as in tests of the state alone)."""
    registry = CollectorRegistry(auto_describe=False)
    if resource_attributes is not None:
        registry.register(TargetInfoCollector(resource_attributes))
    registry.register(AgentCollector(state, gpu))
    return registry
