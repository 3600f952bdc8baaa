"""Panel constructors shared by every dashboard: one Prometheus datasource for all targets, and
a handful of panel shapes (time series, stacked, heatmap, bars, stat).

Dashboards describe *what* to plot as `Query` values; this module decides *how* it is drawn, so
every dashboard looks alike and the test can walk the targets of every panel uniformly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from grafana_foundation_sdk.builders import bargauge, heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders.common import HideSeriesConfig, ReduceDataOptions, StackingConfig, VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import Dashboard, DashboardLink, Row
from grafana_foundation_sdk.builders.heatmap import HeatmapColorOptions, RowsHeatmapOptions
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.common import (
    BarGaugeDisplayMode, FieldTextAlignment, HeatmapCellLayout, LegendDisplayMode, LegendPlacement, StackingMode, VizOrientation,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync, DashboardLinkType, DataSourceRef, DataTransformerConfig, DynamicConfigValue,
)
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from infersight.dashboards.grafana.variables import DATASOURCE_VAR, datasource_variable, filter_variables, filtered
from infersight.dashboards.settings import DEFAULT_DATASOURCE_UID

#: Grafana's plugin id for Prometheus datasources.
PROMETHEUS_TYPE = "prometheus"
#: Grafana's grid is 24 columns wide.
HALF, THIRD, FULL = 12, 8, 24
HEIGHT = 8
#: The panel builders that take queries (they share the methods, not a base class).
QueryPanel = TypeVar("QueryPanel", timeseries.Panel, heatmap.Panel, bargauge.Panel, stat.Panel, table.Panel)


@dataclass(frozen=True)
class Query:
    """One target: a PromQL expression, its legend, and how Grafana should run it.

    exemplar: ask Prometheus for exemplars (trace ids on latency buckets);
    instant: one value per series at the end of the range (bar panels) instead of a range;
    heatmap: Prometheus "heatmap" format (series sorted by their `le` label);
    table: Prometheus "table" format (one row per series, its labels as columns)."""

    expr: str
    legend: str = ""
    exemplar: bool = False
    instant: bool = False
    heatmap: bool = False
    table: bool = False


@dataclass(frozen=True)
class PanelKit:
    """Builds panels whose targets all point at the $datasource variable (whose default is the
    provisioned datasource, by uid) and whose queries are filtered by the template variables
    (variables.filtered)."""

    datasource_uid: str = DEFAULT_DATASOURCE_UID

    @property
    def datasource(self) -> DataSourceRef:
        """The reference every panel, target and variable carries: the $datasource variable."""
        return DataSourceRef(type_val=PROMETHEUS_TYPE, uid="${" + DATASOURCE_VAR + "}")

    def target(self, query: Query, ref_id: str) -> Dataquery:
        """One Prometheus target, filtered by the template variables; `__auto` lets Grafana name
        series when no legend is given."""
        q = (Dataquery().expr(filtered(query.expr)).ref_id(ref_id).datasource(self.datasource)
             .legend_format(query.legend or "__auto"))
        if query.exemplar:
            q = q.exemplar(True)
        if query.heatmap:
            q = q.format(PromQueryFormat.HEATMAP)
        if query.table:
            q = q.format(PromQueryFormat.TABLE)
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

    def table(self, title: str, columns: list[tuple[str, str, Query]], description: str = "",
              width: int = FULL, sort_desc: str = "") -> table.Panel:
        """One row per series: instant table queries merged on their labels (Grafana's merge
        transformation), the rows sorted by one column, descending (sortBy), each value column
        renamed and given its unit. columns: (column name, Grafana unit, query), the query's
        refId in order (A, B, ...); sort_desc: the name of the column to sort by."""
        value_of = {name: f"Value #{chr(ord('A') + i)}" for i, (name, _, _) in enumerate(columns)}
        panel = (table.Panel().title(title).description(description).span(width).height(HEIGHT)
                 .align(FieldTextAlignment.AUTO).inspect(False)  # the model's defaults, explicit: JSON round-trips
                 .with_transformation(DataTransformerConfig(id_val="merge", options={}))
                 .with_transformation(DataTransformerConfig(id_val="sortBy", options={
                     "fields": {}, "sort": [{"field": value_of[sort_desc], "desc": True}]}))
                 .with_transformation(DataTransformerConfig(id_val="organize", options={
                     "excludeByName": {"Time": True}, "indexByName": {},
                     "renameByName": {v: k for k, v in value_of.items()}})))
        for name, unit, _ in columns:
            panel = panel.override_by_name(name, [DynamicConfigValue(id_val="unit", value=unit)])
        return self._targets(panel, [q for _, _, q in columns])

    @staticmethod
    def row(title: str) -> Row:
        """A section heading; the panels added after it belong to it."""
        return Row(title)


#: Every generated dashboard carries this tag; their links list each other through it.
TAG = "infersight"


def base_dashboard(uid: str, title: str, description: str, kit: PanelKit) -> Dashboard:
    """The settings every infersight dashboard shares: tag, time range, refresh, shared crosshair
    (so engine phases line up with GPU panels below them), the template variables (datasource,
    then the fleet filters), and links to the other dashboards that keep the variables' values."""
    d = (Dashboard(title).uid(uid).description(description).tags([TAG]).time("now-15m", "now")
         .refresh("10s").timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR).readonly()
         .link(DashboardLink("infersight").type(DashboardLinkType.DASHBOARDS).tags([TAG])
               .as_dropdown(True).keep_time(True).include_vars(True))
         .with_variable(datasource_variable(kit.datasource_uid)))
    for variable in filter_variables(kit.datasource):
        d = d.with_variable(variable)
    return d
