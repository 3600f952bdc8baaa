"""The fleet view: which node is slow, why, and since when, asked of the Prometheus that holds every
node's series (a central one fed by remote write, Thanos, Mimir). Only PromQL: every aggregate is
computed by Prometheus; this room reshapes and compares what it answers, never aggregates samples.

config.py          FleetConfig: the server, the window, the labels naming a node and a model
prometheus_api.py  PrometheusAPI: instant queries over the HTTP API (urllib), errors as one line
queries.py         the PromQL of each column, built from the metric catalogue's MetricSpecs
table.py           the node x model table (a DataFrame with documented columns) from query answers
outliers.py        outliers by a robust statistic across nodes, with the evidence and the cause
experts.py         the hottest (layer, expert) pairs across the fleet
report.py          FleetReport: the queries run once, the analyses, the agent link for the outlier
render.py          text, JSON and HTML

May import: exporters.catalogue (tests/package/test_import_graph.py: RULES). Nothing of ours imports
it but the command (commands/fleet.py).
"""
from __future__ import annotations

from infersight.fleet.config import FleetConfig  # noqa: F401  (re-exported)
from infersight.fleet.prometheus_api import PrometheusAPI, PrometheusError  # noqa: F401  (re-exported)
from infersight.fleet.report import FleetReport, build_report  # noqa: F401  (re-exported)

__all__ = ["FleetConfig", "FleetReport", "PrometheusAPI", "PrometheusError", "build_report"]
