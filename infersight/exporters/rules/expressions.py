"""PromQL pieces the rules share, built from MetricSpec objects: aggregation clauses, recording
rule names (level:metric:operations) and the bucket matcher an SLI counts at."""
from __future__ import annotations

import json
import re

from infersight.exporters.catalogue import MetricSpec


def by(labels: tuple[str, ...]) -> str:
    return f"by ({', '.join(labels)})"


def level(labels: tuple[str, ...]) -> str:
    """The level part of a recording rule's name: the labels its series keep."""
    return "_".join(labels)


def base_name(spec: MetricSpec) -> str:
    """The metric part of a recording rule's name: the family name (a counter's _total dropped,
    as Prometheus' naming practice asks for rates)."""
    return spec.name


def record_name(labels: tuple[str, ...], metric: str, operations: str) -> str:
    return f"{level(labels)}:{metric}:{operations}"


def le_matcher(bound: float) -> str:
    """`le=~"..."` matching the bucket at `bound` as the agent writes it (prometheus_client:
    "1.0") and as Prometheus 3 stores it after normalising classic-histogram bounds ("1")."""
    from prometheus_client.utils import floatToGoString  # here: `infersight --help` need not load the client

    spellings = {floatToGoString(bound), repr(float(bound)).removesuffix(".0")}
    pattern = "|".join(re.escape(s) for s in sorted(spellings))
    return f"le=~{json.dumps(pattern)}"


def rate_sum(spec: MetricSpec, labels: tuple[str, ...], window: str, series: str = "", matchers: str = "") -> str:
    """sum by (labels) (rate(<series>{matchers}[window])); series defaults to the spec's sample."""
    name = series or spec.sample
    selector = f"{name}{{{matchers}}}" if matchers else name
    return f"sum {by(labels)} (rate({selector}[{window}]))"


def ratio(num: str, den: str) -> str:
    """num / den, not clamped: 0/0 (no traffic) is NaN, every comparison with NaN is false, so an
    alert on a ratio stays silent when nothing happened (a clamped denominator would read 0)."""
    return f"{num}\n/\n{den}"
