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
from infersight.exporters.catalogue.identity import ENGINE_LABEL, engine_labelled
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.exporters.target_info import TargetInfoCollector
from infersight.gpu.exposition import gpu_metric_families

if TYPE_CHECKING:
    from infersight.gpu.sampler import GpuSampler


class ExpositionSettings(Protocol):
    """What the collector reads of the agent's config."""

    exposition: ExpositionConfig


class EngineSlice(Protocol):
    """One engine's share of what the gauges read (the agent's engine_scope.EngineView)."""

    last_step: dict[str, int]
    expert_tokens: np.ndarray
    spec_events: pd.DataFrame
    spec_step_timing: pd.DataFrame


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
    #: With it on, the engine families' label tuples end with the engine (agent.rings.engine_scope).
    engine_label: bool
    ring_engines: dict[str, str]  # ring name -> its engine

    def engine_views(self) -> Mapping[str, EngineSlice]:
        """Each engine's slice (only read with engine_label on)."""
        ...


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

    def _shown(self, spec: MetricSpec) -> MetricSpec:
        """spec as served: with the engine label after its own labels where it carries one."""
        if self.state.engine_label and engine_labelled(spec):
            return replace(spec, labels=(*spec.labels, ENGINE_LABEL))
        return spec

    def _with_zeros(self, spec: MetricSpec, data: LabelledCounter) -> LabelledCounter:
        """data with spec.zero_series at 0 where not counted yet (for each engine with the label on)."""
        if not spec.zero_series:
            return data
        engines = [engine for engine, _ in self._slices()] if self.state.engine_label and engine_labelled(spec) else [[]]
        missing = [key for values in spec.zero_series for engine in engines
                   if (key := (*values, *engine)) not in data.values]
        if not missing:
            return data
        filled = LabelledCounter()
        filled.values.update(data.values)
        filled.values.update(dict.fromkeys(missing, 0.0))
        return filled

    def _slices(self) -> list[tuple[list[str], EngineSlice]]:
        """(engine label values, what the gauges read): the state itself with the label off, each
        engine's slice with it on."""
        if not self.state.engine_label:
            return [([], self.state)]
        return [([name], view) for name, view in sorted(self.state.engine_views().items())]

    def collect(self) -> Iterator[Metric]:
        state, cfg = self.state, self.state.config.exposition
        with state.lock:
            for spec in C.CATALOGUE:
                if spec in C.GPU_METRICS:  # rendered from the sampler by gpu_metric_families
                    continue
                if spec.kind == "counter" and spec.name not in (C.EXPERT_TOKENS.name, C.PROBE_EVENTS.name,
                                                               C.PROBE_DROPPED.name, C.PROBE_CORRUPT.name,
                                                               C.PROBE_LOST.name):
                    yield _counter(self._shown(spec), self._with_zeros(spec, state.counters[spec.name]),
                                   extra=self._id(spec))
                elif spec.kind == "histogram":
                    yield _histogram(self._shown(spec), state.histograms[spec.name], extra=self._id(spec))
            slices = self._slices()
            yield from self._engine_gauges(slices)
            yield from self._moe(slices, cfg.max_expert_series, cfg.top_hot_pairs)
            yield from self._spec_gauges(slices)
            yield from self._probe_counters()
            if cfg.vllm_compat:
                yield from self._vllm(cfg.model_name)
        if self.gpu is not None:  # the sampler has its own lock
            yield from gpu_metric_families(self.gpu)

    def _engine_gauges(self, slices: list[tuple[list[str], EngineSlice]]) -> Iterator[Metric]:
        rows: dict[str, list[tuple[list[str], float]]] = {}
        for engine, view in slices:
            last = view.last_step
            if not last:
                continue
            total, used, cached = last["kv_blocks_total"], last["kv_blocks_in_use"], last["kv_blocks_cached"]
            for spec, own in ((C.REQUESTS_RUNNING, [([], last["running"])]), (C.REQUESTS_WAITING, [([], last["waiting"])]),
                              (C.REQUESTS_SWAPPED, [([], last["swapped"])]),
                              (C.KV_BLOCKS, [(["in_use"], used), (["cached"], cached), (["free"], total - used - cached)]),
                              (C.KV_USAGE, [([], used / total if total else 0.0)])):
                rows.setdefault(spec.name, []).extend((labels + engine, value) for labels, value in own)
        for spec in (C.REQUESTS_RUNNING, C.REQUESTS_WAITING, C.REQUESTS_SWAPPED, C.KV_BLOCKS, C.KV_USAGE):
            if spec.name in rows:
                yield _gauge(self._shown(spec), rows[spec.name], extra=self._id(spec))

    def _moe(self, slices: list[tuple[list[str], EngineSlice]], cap: int, top_n: int) -> Iterator[Metric]:
        slices = [(engine, view) for engine, view in slices if view.expert_tokens.size]
        if not slices:
            return
        ident = self._id(C.EXPERT_TOKENS)
        shown = self._shown(C.EXPERT_TOKENS)
        fam = CounterMetricFamily(C.EXPERT_TOKENS.name, C.EXPERT_TOKENS.help,
                                  labels=[*shown.labels, *(k for k, _ in ident)])
        values = [v for _, v in ident]
        hot: list[tuple[list[str], float]] = []
        imbalance: list[tuple[list[str], float]] = []
        for engine, view in slices:
            m = view.expert_tokens
            if m.size <= cap:
                for (layer, expert), v in zip(((l, e) for l in range(m.shape[0]) for e in range(m.shape[1])), m.ravel()):
                    fam.add_metric([str(layer), str(expert), *engine, *values], float(v))
            else:
                for expert, v in enumerate(m.sum(axis=0)):
                    fam.add_metric(["all", str(expert), *engine, *values], float(v))
            # The hottest pairs under the cap too: the dashboards read them from this one gauge (top_n
            # series), whichever shape the expert counter has.
            top = moe.top_pairs(moe.matrix_frame(m), top_n)
            hot += [([str(r.layer), str(r.expert), *engine], float(r.tokens)) for r in top.itertuples(index=False)]
            for r in moe.layer_imbalance(moe.matrix_frame(m)).itertuples(index=False):
                for stat in ("max_over_mean", "cv", "hot_cold_ratio"):
                    imbalance.append(([str(r.layer), stat, *engine], float(getattr(r, stat))))
        yield _gauge(self._shown(C.HOT_EXPERT_TOKENS), hot, extra=self._id(C.HOT_EXPERT_TOKENS))
        yield fam
        yield _gauge(self._shown(C.MOE_IMBALANCE), imbalance, extra=self._id(C.MOE_IMBALANCE))

    def _spec_gauges(self, slices: list[tuple[list[str], EngineSlice]]) -> Iterator[Metric]:
        speedup: list[tuple[list[str], float]] = []
        accept: list[tuple[list[str], float]] = []
        for engine, view in slices:
            by_task = spec_speedup.speedup_by_task(view.spec_events, view.spec_step_timing)
            speedup += [([str(r.task), *engine], float(r.predicted_speedup))
                        for r in by_task.itertuples(index=False) if r.basis == spec_speedup.PREDICTED]
            accept += [([str(r.task), *engine], float(r.accept_rate)) for r in by_task.itertuples(index=False)]
        if not accept:  # no verification of any engine: no family (speedup rows come with accept rows)
            return
        yield _gauge(self._shown(C.SPEC_PREDICTED_SPEEDUP), speedup, extra=self._id(C.SPEC_PREDICTED_SPEEDUP))
        yield _gauge(self._shown(C.SPEC_ACCEPT_RATE), accept, extra=self._id(C.SPEC_ACCEPT_RATE))

    def _probe_counters(self) -> Iterator[Metric]:
        engines = self.state.ring_engines if self.state.engine_label else None
        for spec, key in ((C.PROBE_EVENTS, "produced"), (C.PROBE_DROPPED, "dropped"), (C.PROBE_CORRUPT, "corrupt"),
                          (C.PROBE_LOST, "reader_lost")):
            data = LabelledCounter()
            for ring, stats in self.state.ring_stats.items():
                data.inc((ring,) if engines is None else (ring, engines.get(ring, ring)), stats.get(key, 0))
            yield _counter(self._shown(spec), data, extra=self._id(spec))

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
        for labels, value in self.state.counters[C.REQUESTS.name].values.items():  # (task, reason[, engine])
            reason = labels[1]
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
