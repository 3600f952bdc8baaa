"""The Kernels dashboard. Kernel-level data comes from profiler captures, which are analysed
offline (see the HTML report); no kernel metric is exported yet. Until the catalogue has a
`KERNEL_METRICS` block this is a placeholder row that says so, rather than panels over metric
names nobody serves. With the block, each entry gets a panel derived from its kind."""
from __future__ import annotations

from collections.abc import Iterable

from grafana_foundation_sdk.builders.dashboard import Dashboard

from infersight.dashboards.grafana import promql
from infersight.dashboards.grafana.panels import FULL, HALF, PanelKit, Query, base_dashboard
from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec

UID = "infersight-kernels"


def kernel_metrics() -> tuple[MetricSpec, ...]:
    """The catalogue's kernel block, () while it does not exist."""
    block = getattr(C, "KERNEL_METRICS", ())
    specs: Iterable[object] = block.values() if isinstance(block, dict) else block
    return tuple(s for s in specs if isinstance(s, MetricSpec))


def build(kit: PanelKit) -> Dashboard:
    """The Kernels dashboard's builder: a placeholder row until KERNEL_METRICS exists."""
    d = base_dashboard(UID, "infersight / Kernels", "GPU kernels by category, from exported kernel metrics.")
    d = d.with_row(kit.row("Kernels"))
    specs = kernel_metrics()
    if not specs:
        return d.with_panel(kit.note("No kernel metrics yet", (
            "No kernel-level metric is exported yet, so this row is a placeholder. For kernel "
            "categories and a roofline of a profiler capture, see the HTML report "
            "(`infersight report OUT_DIR`)."), width=FULL))
    for spec in specs:
        by = ", ".join(spec.labels)
        legend = " ".join(f"{{{{{label}}}}}" for label in spec.labels) or spec.name
        d = d.with_panel(kit.timeseries(spec.help.rstrip("."), [Query(promql.default_query(spec, by=by), legend)],
                                        width=HALF, description=spec.help))
    return d
