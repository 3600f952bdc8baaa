"""Plain cumulative aggregates the agent keeps: labelled counters and histograms with exemplars.

They hold numbers only; the exporters turn them into metric families at scrape time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Labels = tuple[str, ...]


@dataclass
class Exemplar:
    trace_id: str
    value: float
    timestamp: float  # wall-clock seconds


class LabelledCounter:
    def __init__(self) -> None:
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + float(amount)

    def get(self, labels: Labels) -> float:
        return self.values.get(labels, 0.0)

    def total(self) -> float:
        return float(sum(self.values.values()))


@dataclass
class HistogramSeries:
    counts: np.ndarray  # per bucket (not cumulative), the last one is +Inf
    sum: float = 0.0
    exemplars: dict[int, Exemplar] = field(default_factory=dict)  # bucket index -> latest exemplar

    @property
    def count(self) -> int:
        return int(self.counts.sum())


class LabelledHistogram:
    """Fixed upper bounds (+Inf implied); observe many values at once."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.bounds = np.asarray(buckets, dtype=float)
        self.series: dict[Labels, HistogramSeries] = {}

    def observe(self, labels: Labels, values: np.ndarray | list[float],
                exemplar_trace_ids: list[str] | None = None, wall_time: float = 0.0) -> None:
        values = np.asarray(values, dtype=float)
        if values.size == 0:
            return
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = HistogramSeries(np.zeros(len(self.bounds) + 1, dtype=np.int64))
        # le semantics: a value equal to a bound falls in that bound's bucket.
        idx = np.searchsorted(self.bounds, values, side="left")
        s.counts += np.bincount(idx, minlength=len(s.counts))
        s.sum += float(values.sum())
        if exemplar_trace_ids is not None:  # the last value into each bucket is its exemplar
            n = min(len(idx), len(exemplar_trace_ids))
            buckets, first_from_end = np.unique(idx[:n][::-1], return_index=True)
            for bucket, pos in zip(buckets.tolist(), (n - 1 - first_from_end).tolist()):
                s.exemplars[bucket] = Exemplar(exemplar_trace_ids[pos], float(values[pos]), wall_time)

    def cumulative(self, labels: Labels) -> list[tuple[str, int, Exemplar | None]]:
        """(le, cumulative count, exemplar) rows as the exposition wants them."""
        s = self.series[labels]
        cum = np.cumsum(s.counts)
        les = [_fmt(b) for b in self.bounds] + ["+Inf"]
        return [(le, int(c), s.exemplars.get(i)) for i, (le, c) in enumerate(zip(les, cum))]


def _fmt(bound: float) -> str:
    return repr(float(bound))


def quantile(values: np.ndarray, q: float) -> float:
    """NaN for no data, so a summary never invents a latency."""
    return float(np.quantile(values, q)) if len(values) else float("nan")
