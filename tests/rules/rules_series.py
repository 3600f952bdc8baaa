"""Input series for promtool unit tests, named from the catalogue (MetricSpec) and built from
per-minute scenarios: counters from their increments, gauges from their values, latency histograms
from how many observations per minute fell within an objective and how many beyond it."""
from __future__ import annotations

from typing import Callable

from infersight.exporters.catalogue import MetricSpec


def selector(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def _num(v: float) -> str:
    return repr(float(v)).removesuffix(".0")


def counter_values(phases: list[tuple[int, float]]) -> str:
    """promtool's notation for a counter that starts at 0 at t=0 and then, for each (minutes,
    increment) phase, grows by `increment` every minute: one value per minute, 0..sum(minutes)."""
    parts, value, first = [], 0.0, True
    for minutes, inc in phases:
        if first:  # "0+incxN" is N+1 values: t=0 and the phase's N minutes
            parts.append(f"0+{_num(inc)}x{minutes}")
            first = False
        elif minutes:
            parts.append(f"{_num(value + inc)}+{_num(inc)}x{minutes - 1}")
        value += inc * minutes
    return " ".join(parts)


def gauge_values(phases: list[tuple[int, float]]) -> str:
    """A gauge holding each phase's value for its minutes (the first phase also at t=0)."""
    parts, first = [], True
    for minutes, v in phases:
        parts.append(f"{_num(v)}x{minutes if first else minutes - 1}")
        first = False
    return " ".join(parts)


def histogram_series(spec: MetricSpec, labels: dict[str, str], phases: list[tuple[int, float, float]],
                     threshold: float, beyond: float, le_text: Callable[[float], str]) -> list[dict[str, str]]:
    """A histogram's _bucket, _count and _sum series: per minute, `within` observations at exactly
    `threshold` (an upper bound is inclusive, so they count as within) and `beyond_n` at `beyond`,
    for each (minutes, within, beyond_n) phase. le_text spells the bounds as an exporter would."""
    bounds = list(spec.buckets or ()) + [float("inf")]
    out = []
    for b in bounds:
        per_min = [(m, (w if threshold <= b else 0.0) + (x if beyond <= b else 0.0)) for m, w, x in phases]
        le = "+Inf" if b == float("inf") else le_text(b)
        out.append({"series": selector(spec.name + "_bucket", {**labels, "le": le}),
                    "values": counter_values(per_min)})
    out.append({"series": selector(spec.name + "_count", labels),
                "values": counter_values([(m, w + x) for m, w, x in phases])})
    out.append({"series": selector(spec.name + "_sum", labels),
                "values": counter_values([(m, w * threshold + x * beyond) for m, w, x in phases])})
    return out
