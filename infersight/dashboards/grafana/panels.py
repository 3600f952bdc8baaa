"""Panel constructors shared by every dashboard: one Prometheus datasource for all targets, and
a handful of panel shapes (time series, stacked, heatmap, bars, stat).

Dashboards describe *what* to plot as `Query` values; this module decides *how* it is drawn, so
every dashboard looks alike and the test can walk the targets of every panel uniformly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from grafana_foundation_sdk.builders import bargauge, heatmap, stat, timeseries
from grafana_foundation_sdk.builders.common import HideSeriesConfig, ReduceDataOptions, StackingConfig, VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import Dashboard, DashboardLink, Row
from grafana_foundation_sdk.builders.heatmap import HeatmapColorOptions, RowsHeatmapOptions
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.common import (
    BarGaugeDisplayMode, HeatmapCellLayout, LegendDisplayMode, LegendPlacement, StackingMode, VizOrientation,
)
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DashboardLinkType, DataSourceRef
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from infersight.dashboards.settings import DEFAULT_DATASOURCE_UID

#: Grafana's plugin id for Prometheus datasources.
PROMETHEUS_TYPE = "prometheus"
#: Grafana's grid is 24 columns wide.
HALF, THIRD, FULL = 12, 8, 24
HEIGHT = 8
#: The panel builders that take queries (they share the methods, not a base class).
QueryPanel = TypeVar("QueryPanel", timeseries.Panel, heatmap.Panel, bargauge.Panel, stat.Panel)


@dataclass(frozen=True)
class Query:
    """One target: a PromQL expression, its legend, and how Grafana should run it.

    exemplar: ask Prometheus for exemplars (trace ids on latency buckets);
    instant: one value per series at the end of the range (bar panels) instead of a range;
    heatmap: Prometheus "heatmap" format (series sorted by their `le` label)."""

    expr: str
    legend: str = ""
    exemplar: bool = False
    instant: bool = False
    heatmap: bool = False


@dataclass(frozen=True)
class PanelKit:
    """Builds panels whose targets all point at one datasource (by uid, as provisioned)."""

    datasource_uid: str = DEFAULT_DATASOURCE_UID

    @property
    def datasource(self) -> DataSourceRef:
        """The reference every panel, target and variable carries (type and uid, as provisioned)."""
        return DataSourceRef(type_val=PROMETHEUS_TYPE, uid=self.datasource_uid)

    def target(self, query: Query, ref_id: str) -> Dataquery:
        """One Prometheus target; `__auto` lets Grafana name series when no legend is given."""
        q = (Dataquery().expr(query.expr).ref_id(ref_id).datasource(self.datasource)
             .legend_format(query.legend or "__auto"))
        if query.exemplar:
            q = q.exemplar(True)
        if query.heatmap:
            q = q.format(PromQueryFormat.HEATMAP)
        return q.instant() if query.instant else q.range()

    def _targets(self, panel: QueryPanel, queries: list[Query]) -> QueryPanel:
        panel = panel.datasource(self.datasource)
        for i, query in enumerate(queries):
            panel = panel.with_target(self.target(query, chr(ord("A") + i)))
        return panel

    def timeseries(self, title: str, queries: list[Query], unit: str = "short", description: str = "",
                   width: int = HALF, stack: bool = False, percent: bool = False) -> timeseries.Panel:
        """Lines, or areas stacked on each other (stack) or normalised to 100% (percent)."""
        panel = (timeseries.Panel().title(title).description(description).unit(unit).span(width).height(HEIGHT)
                 .legend(VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST)
                         .placement(LegendPlacement.BOTTOM)))
        if stack or percent:
            mode = StackingMode.PERCENT if percent else StackingMode.NORMAL
            panel = panel.stacking(StackingConfig().mode(mode).group("A")).fill_opacity(60).line_width(1)
        else:
            panel = panel.fill_opacity(10)
        return self._targets(panel, queries)

    def heatmap(self, title: str, queries: list[Query], unit: str = "short", description: str = "",
                width: int = HALF, buckets: bool = False) -> heatmap.Panel:
        """Time on x. buckets: the query returns histogram buckets (format heatmap, `le` rows);
        otherwise each series is one row (e.g. one expert), its value the cell colour."""
        panel = (heatmap.Panel().title(title).description(description).span(width).height(HEIGHT)
                 .calculate(False).color(HeatmapColorOptions().mode(HeatmapColorMode.SCHEME).scheme("Oranges"))
                 .show_legend().hide_from(HideSeriesConfig().legend(False).tooltip(False).viz(False)))
        if buckets:
            panel = panel.rows_frame(RowsHeatmapOptions().layout(HeatmapCellLayout.LE)).unit(unit)
        else:
            panel = panel.cell_values(heatmap.CellValues().unit(unit))
        return self._targets(panel, queries)

    def bars(self, title: str, queries: list[Query], unit: str = "short", description: str = "",
             width: int = HALF, max_value: float | None = None) -> bargauge.Panel:
        """One horizontal bar per series (instant queries: the value at the end of the range)."""
        panel = (bargauge.Panel().title(title).description(description).unit(unit).span(width).height(HEIGHT)
                 .display_mode(BarGaugeDisplayMode.GRADIENT).orientation(VizOrientation.HORIZONTAL)
                 .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False)).min(0))
        if max_value is not None:
            panel = panel.max(max_value)
        return self._targets(panel, queries)

    def stat(self, title: str, queries: list[Query], unit: str = "short", description: str = "",
             width: int = 4) -> stat.Panel:
        """One big number per series."""
        panel = (stat.Panel().title(title).description(description).unit(unit).span(width).height(4)
                 .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
        return self._targets(panel, queries)

    @staticmethod
    def row(title: str) -> Row:
        """A section heading; the panels added after it belong to it."""
        return Row(title)


#: Every generated dashboard carries this tag; their links list each other through it.
TAG = "infersight"


def base_dashboard(uid: str, title: str, description: str) -> Dashboard:
    """The settings every infersight dashboard shares: tag, time range, refresh, shared crosshair
    (so engine phases line up with GPU panels below them), and links to the other dashboards."""
    return (Dashboard(title).uid(uid).description(description).tags([TAG]).time("now-15m", "now")
            .refresh("10s").timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR).readonly()
            .link(DashboardLink("infersight").type(DashboardLinkType.DASHBOARDS).tags([TAG])
                  .as_dropdown(True).keep_time(True)))
