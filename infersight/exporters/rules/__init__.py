"""Prometheus rule files generated from the metric catalogue: recording rules for the dashboards'
heavy queries, SLO burn-rate alerts on TTFT, ITL and e2e, and alerts on the engine, the agent and
the GPUs (dcgm-exporter). `write_rules` writes them; `infersight rules` is its command line.

Every series name comes from a MetricSpec (the catalogue's, or `dcgm`'s for dcgm-exporter's
names), never a typed string, so a renamed metric breaks the generator's tests, not production.
This room imports only `exporters.catalogue` (and the standard library: the YAML is written by
hand, as the dashboards' provisioning files are).
"""
from __future__ import annotations

from infersight.exporters.rules.config import RulesConfig  # noqa: F401  (re-exported)
from infersight.exporters.rules.files import build_groups, write_rules  # noqa: F401  (re-exported)

__all__ = ["RulesConfig", "build_groups", "write_rules"]
