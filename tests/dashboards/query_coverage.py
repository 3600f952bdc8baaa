"""Which dashboard queries an exposition can answer, for hosts with no Prometheus to ask (the GPU
check runs on a machine that has none).

A query is taken to have data when every metric it names has at least one sample in the
exposition; a query made of alternatives (`a or b`) when one alternative has. Label matchers
are not evaluated, so this is a necessary condition for data, checked per query. The dashboards'
queries are all sums, rates, ratios and quantiles of the series they name, for which it is also
the condition that matters on a host: the series exist.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from infersight.exporters import catalogue as C

_NAME = re.compile(re.escape(C.P) + r"[a-zA-Z0-9_]+")


@dataclass(frozen=True)
class QueryCoverage:
    """One target of one panel: whether the exposition has the series it needs (`missing` if not)."""

    dashboard: str
    panel: str
    expr: str
    missing: tuple[str, ...]

    @property
    def has_data(self) -> bool:
        return not self.missing


def sample_names(exposition: str) -> set[str]:
    """The names of the samples an exposition (Prometheus text format) holds."""
    return {s.name for family in text_string_to_metric_families(exposition) for s in family.samples}


def _missing(expr: str, present: set[str]) -> tuple[str, ...]:
    """The metric names of the first alternative that lacks some, or () when one has them all."""
    missing: tuple[str, ...] = ()
    for i, side in enumerate(expr.split(" or ")):
        lacking = tuple(sorted(n for n in set(_NAME.findall(side)) if n not in present))
        if not lacking:
            return ()
        missing = lacking if i == 0 else missing
    return missing


def _targets(board: dict) -> Iterator[tuple[str, str]]:
    for panel in board["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            for target in p.get("targets", []):
                yield p["title"], target["expr"]


def query_coverage(boards: dict[str, dict], present: set[str]) -> list[QueryCoverage]:
    """Every target of every dashboard (uid -> Grafana JSON model) against the sample names present."""
    return [QueryCoverage(uid, title, expr, _missing(expr, present))
            for uid, board in boards.items() for title, expr in _targets(board)]
