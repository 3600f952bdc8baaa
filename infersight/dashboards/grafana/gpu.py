"""The GPU dashboard: engine phases and step time on top, GPU activity, power and memory below on
the same time axis (shared crosshair), so a drop in tensor activity can be read against what
the engine was doing.

The GPU metrics are a catalogue block of their own (`GPU_METRICS`). Their panels are derived from
the entries alone, grouped by unit, so no GPU metric name is typed here. The GPU panels, and the
two energy panels of the engine row, get data only on a host whose GPU is sampled (a CPU run
leaves them empty; `benchmarks/energy_check.py` checks each of them against a GPU host's scrape).
"""
from __future__ import annotations

from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard

from infersight.dashboards.grafana import promql
from infersight.dashboards.grafana.panels import HALF, THIRD, PanelKit, Query, base_dashboard
from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec

UID = "infersight-gpu"
#: Panel title and Grafana unit per metric unit, in display order. Counters are drawn as rates,
#: so an energy counter (joules) lands in the power panel (joules per second are watts).
UNIT_PANELS: dict[str, tuple[str, str]] = {
    "ratio": ("GPU activity", "percentunit"),
    "watts": ("GPU power", "watt"),
    "bytes": ("GPU memory", "bytes"),
    "bytes_per_second": ("GPU interconnect", "Bps"),
    "hertz": ("GPU clocks", "hertz"),
    "celsius": ("GPU temperature", "celsius"),
    "": ("GPU telemetry", "short"),  # unitless counts, such as failed polls
}
#: The engine row's panels fed by the GPU's energy counter (empty on a CPU run).
ENERGY_TITLE = "GPU energy by task, and idle"
ENERGY_PER_TOKEN_TITLE = "Energy per output token, by task"
#: Labels identifying a device in GPU series; a uuid only repeats the device index.
NOT_GROUPED = ("uuid",)


def gpu_metrics() -> tuple[MetricSpec, ...]:
    """The catalogue's GPU block."""
    return C.GPU_METRICS


def _unit(spec: MetricSpec) -> str:
    """The base unit a spec is drawn in: its declared unit, else the unit its name ends with."""
    unit = spec.unit or next((u for u in sorted(UNIT_PANELS, key=len, reverse=True)
                              if u and spec.name.endswith("_" + u)), "")
    return "watts" if spec.kind == "counter" and unit == "joules" else unit


def _short_name(spec: MetricSpec, specs: tuple[MetricSpec, ...]) -> str:
    """A legend name: the spec's name without the prefix every GPU metric shares."""
    names = [s.name for s in specs]
    prefix = names[0]
    for name in names[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    return spec.name[len(prefix):] or spec.name


def _unit_groups(specs: tuple[MetricSpec, ...]) -> dict[str, list[MetricSpec]]:
    """The specs by the unit they are drawn in, in display order."""
    groups: dict[str, list[MetricSpec]] = {}
    for spec in specs:
        groups.setdefault(_unit(spec), []).append(spec)
    order = [u for u in UNIT_PANELS if u in groups] + sorted(u for u in groups if u not in UNIT_PANELS)
    return {u: groups[u] for u in order}


def _title(unit: str) -> str:
    return UNIT_PANELS.get(unit, (f"GPU {unit}", "short"))[0]


def gpu_fed_titles() -> set[str]:
    """Titles of this dashboard's panels that only a sampled GPU feeds: empty on a CPU run, and
    each checked on a GPU host (benchmarks/energy_check.py). The failed-polls panel is not one:
    every collector, the CPU's none included, reports its errors."""
    groups = _unit_groups(gpu_metrics())
    fed = {_title(u) for u, specs in groups.items() if any(s is not C.GPU_COLLECTOR_ERRORS for s in specs)}
    return fed | {ENERGY_TITLE, ENERGY_PER_TOKEN_TITLE}


def gpu_panels(kit: PanelKit, specs: tuple[MetricSpec, ...]) -> list[timeseries.Panel]:
    """One time series panel per unit group, one query per metric, summed per device."""
    groups = _unit_groups(specs)
    panels = []
    for unit in groups:
        title, grafana_unit = UNIT_PANELS.get(unit, (_title(unit), "short"))
        queries = []
        for spec in groups[unit]:
            by = ", ".join(label for label in spec.labels if label not in NOT_GROUPED)
            labels = [f"{label} {{{{{label}}}}}" for label in spec.labels if label not in NOT_GROUPED]
            legend = " ".join([*labels, _short_name(spec, specs)])
            queries.append(Query(promql.default_query(spec, by=by), legend))
        panels.append(kit.timeseries(title, queries, unit=grafana_unit, width=HALF,
                                     description=" ".join(s.help for s in groups[unit])))
    return panels


def build(kit: PanelKit) -> Dashboard:
    """The GPU dashboard's builder: engine row first, then the GPU block's panels (or a note)."""
    d = base_dashboard(UID, "infersight / GPU",
                       "GPU telemetry under the engine's phases, on one time axis.", kit)
    d = d.with_row(kit.row("Engine"))
    d = d.with_panel(kit.timeseries("Request time by phase", [
        Query(C.PHASE.views["share"], "{{phase}}")], unit="s", width=THIRD, stack=True,
        description="Seconds of request time per second of wall time, by phase."))
    d = d.with_panel(kit.timeseries("Step duration", [
        Query(expr, name) for name, expr in sorted(C.STEP_DURATION.views.items())], unit="s", width=THIRD))
    d = d.with_panel(kit.timeseries("Tokens fed to the model, by kind", [
        Query(C.STEP_TOKENS.rate(by="kind"), "{{kind}}")], unit="short", width=THIRD, stack=True))
    d = d.with_panel(kit.timeseries("Engine step time attributed to requests, by task", [
        Query(C.ENGINE_SECONDS.rate(by="task"), "{{task}}")], unit="s", width=THIRD, stack=True,
        description=C.ENGINE_SECONDS.help + " Seconds per second of wall time."))
    d = d.with_panel(kit.timeseries(ENERGY_TITLE, [
        Query(C.ENERGY.rate(by="task"), "{{task}}"), Query(C.ENERGY_IDLE.rate(), "idle (between steps)")],
        unit="watt", width=THIRD, stack=True,
        description=C.ENERGY.help + " " + C.ENERGY_IDLE.help + " Stacked, the two are the GPU's power."))
    d = d.with_panel(kit.timeseries(ENERGY_PER_TOKEN_TITLE, [
        Query(C.ENERGY.views["per_output_token"], "{{task}}")], unit="joule", width=THIRD,
        description="Joules attributed to finished requests per output token they generated, by task."))

    d = d.with_row(kit.row("GPU"))
    for panel in gpu_panels(kit, gpu_metrics()):
        d = d.with_panel(panel)
    return d
