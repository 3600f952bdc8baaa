"""Catalogue metrics read from an engine's own exposition, and their merge into the agent's /metrics.

Some engines can be watched without anything installed in them, only by scraping their
/metrics (infersight.sources.vllm.metrics). Such a source cannot produce probe records (it sees
totals, not events), so it produces a ScrapedView instead: samples keyed by catalogue name, with
the catalogue's labels. This module knows nothing about which engine wrote them.

The rule that keeps a metric from being counted twice, when a probe ring from the same engine is
attached as well ("the ring wins for what it provides"):

    for each catalogue family, at each scrape of the agent:
      - the ring-fed family has samples      -> serve it, and remember: the ring owns it for good
        (the zeros a counter is served with before anything is counted, MetricSpec.zero_series,
        are not the ring's: they say nothing happened, not that the ring watches it)
      - the ring has never provided it       -> serve the scraped samples under the same name
      - the ring owns it                     -> drop the scraped samples (even while the ring's
                                                family is empty again, e.g. a gauge before a step)

So one name never carries samples from both sources, and once the ring has provided a family
the scraped one never comes back (a series that flapped between two sources would look like a
counter reset). With --vllm-compat the agent also serves its ring-fed state under the engine's
names; for a family served from the scrape that copy holds only zeros, so it is dropped too (the
engine's own /metrics has the real one).

Histograms keep the source's bucket bounds: `histogram_quantile(q, sum by (le) (rate(x_bucket[..])))`
is correct for any bounds as long as all series summed by `le` share them, which the rule above
guarantees; re-binning into the catalogue's bounds would have to invent where observations fell.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec

Labels = tuple[str, ...]


@dataclass(frozen=True)
class ScrapedHistogram:
    """bounds: finite upper bounds, ascending; cumulative: a count per bound plus +Inf (the total)."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float

    @property
    def count(self) -> float:
        return self.cumulative[-1]


@dataclass
class ScrapedView:
    """One scrape, normalised: values (counters and gauges) and histograms by catalogue name, then
    by label values in the order of the spec's labels. steps: the engine's step counter, when it has
    one (used to count capture windows; None when the scrape had none)."""

    values: dict[str, dict[Labels, float]] = field(default_factory=dict)
    histograms: dict[str, dict[Labels, ScrapedHistogram]] = field(default_factory=dict)
    steps: float | None = None

    def names(self) -> set[str]:
        return set(self.values) | set(self.histograms)


def scraped_family(spec: MetricSpec, view: ScrapedView, model_name: str = "") -> Metric:
    """The catalogue family of `spec` holding the view's samples (same name, help, labels, unit as the
    agent's own rendering of it, model_name included where the spec has it as an identity label)."""
    ident = [model_name for label in spec.identity_labels if label == C.MODEL_LABEL]
    labels = [*spec.labels, *spec.identity_labels]
    if spec.kind == "histogram":
        fam = HistogramMetricFamily(spec.name, spec.help, labels=labels, unit=spec.unit)
        for key, h in sorted(view.histograms.get(spec.name, {}).items()):
            les = [floatToGoString(b) for b in h.bounds] + ["+Inf"]
            fam.add_metric([*key, *ident], list(zip(les, h.cumulative)), h.sum)
        return fam
    cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    fam = cls(spec.name, spec.help, labels=labels)
    for key, value in sorted(view.values.get(spec.name, {}).items()):
        fam.add_metric([*key, *ident], value)
    return fam


class MergedCollector(Collector):
    """The agent's own families (`inner`: its registry) with the scraped view merged in by the rule in
    the module docstring. `view` returns the latest view (None before the first good scrape);
    model_name: the served model, the engine families' identity label (as the agent's own carry it)."""

    def __init__(self, inner: Collector, view: Callable[[], ScrapedView | None], model_name: str = "") -> None:
        self.inner = inner
        self.view = view
        self.model_name = model_name
        self.ring_owned: set[str] = set()  # families the ring has provided; the scrape never serves them again
        self._specs = {spec.name: spec for spec in C.CATALOGUE}

    def collect(self) -> Iterator[Metric]:
        view = self.view()
        scraped = view.names() & set(self._specs) if view is not None else set()
        own = list(self.inner.collect())
        for fam in own:
            if fam.name in self._specs and self._ring_fed(fam):
                self.ring_owned.add(fam.name)
        served = scraped - self.ring_owned
        compat_copies = {self._specs[n].vllm_name for n in served if self._specs[n].vllm_name}
        for fam in own:
            if fam.name in served or fam.name in compat_copies:
                continue  # replaced below (an empty ring-fed family), or a compat copy of zeros
            yield fam
        for name in sorted(served):
            yield scraped_family(self._specs[name], view, self.model_name)  # type: ignore[arg-type]  # served is empty without a view

    def _ring_fed(self, fam: Metric) -> bool:
        """Whether the family holds a sample the ring counted (not only its zero_series zeros)."""
        spec = self._specs[fam.name]
        zeros = set(spec.zero_series)
        return any(s.value != 0 or tuple(s.labels.get(label, "") for label in spec.labels) not in zeros
                   for s in fam.samples)
