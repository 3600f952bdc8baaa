"""PromQL built from catalogue entries only, for what MetricSpec's own helpers do not cover:
label matchers, ratios of two counters, and bucket rates for heatmaps.

Every function takes MetricSpec objects and derives series names from `spec.sample` or
`spec.name`, so no metric name is ever typed in the dashboards code.
"""
from __future__ import annotations

from infersight.exporters.catalogue import MetricSpec

RATE_WINDOW = "$__rate_interval"


def matchers(**labels: str) -> str:
    """`{a=~"x", b=~"y"}` (regex matchers, so template variables holding "a|b" or ".*" work);
    "" without labels."""
    if not labels:
        return ""
    return "{" + ", ".join(f'{k}=~"{v}"' for k, v in labels.items()) + "}"


def selector(spec: MetricSpec, **labels: str) -> str:
    """The spec's sample series with regex matchers."""
    return spec.sample + matchers(**labels)


def summed(spec: MetricSpec, by: str = "", **labels: str) -> str:
    """A gauge summed (by the given labels): `sum by (by) (sample{...})`."""
    group = f" by ({by})" if by else ""
    return f"sum{group} ({selector(spec, **labels)})"


def rate(spec: MetricSpec, by: str = "", window: str = RATE_WINDOW, **labels: str) -> str:
    """spec.rate() with label matchers (spec.rate() itself when there are none)."""
    if not labels:
        return spec.rate(by=by, window=window)
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({selector(spec, **labels)}[{window}]))"


def increase(spec: MetricSpec, by: str = "", window: str = "$__range") -> str:
    """Growth of a counter over the dashboard's range (for instant bar panels)."""
    group = f" by ({by})" if by else ""
    return f"sum{group} (increase({spec.sample}[{window}]))"


def ratio(num: str, den: str) -> str:
    """num / den with the denominator clamped away from 0, as the catalogue's views do."""
    return f"({num}) / clamp_min({den}, 1e-9)"


def bucket_rate(spec: MetricSpec, by: str = "le", window: str = RATE_WINDOW, **labels: str) -> str:
    """Per-bucket rate of a histogram, for Grafana's heatmap (format=heatmap needs `le`)."""
    if spec.kind != "histogram":
        raise ValueError(f"{spec.name} is a {spec.kind}, not a histogram")
    return f"sum by ({by}) (rate({spec.name}_bucket{matchers(**labels)}[{window}]))"


def default_query(spec: MetricSpec, by: str = "") -> str:
    """A sensible query for a spec known only by its kind (GPU and kernel blocks appended to the
    catalogue later): counters as rates, histograms as p50, gauges as they are."""
    if spec.kind == "counter":
        return spec.rate(by=by)
    if spec.kind == "histogram":
        return spec.quantile(0.5, by=by)
    return summed(spec, by=by) if by else spec.sample
