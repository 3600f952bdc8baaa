"""The Kernels dashboard: the flight recorder's always-on kernel view (agent.flight_recorder).

Every series comes from sampled windows of a few steps, so it is read as shares and ratios: where
device time goes by category and phase, the launch-gap share and kernels per step, achieved FLOP/s
and bandwidth against the roofline, and what the recorder itself costs against its budget. Full
captures taken on a trigger (a latency objective breached, a preemption storm, a step-time jump)
are annotations on every panel. On a CPU engine the "device time" is op time (kernels.analysis.cpu_trace).
"""
from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import AnnotationQuery, Dashboard

from infersight.dashboards.grafana import promql
from infersight.dashboards.grafana.panels import HALF, THIRD, PanelKit, Query, base_dashboard
from infersight.dashboards.grafana.variables import filtered
from infersight.exporters import catalogue as C

UID = "infersight-kernels"
TRIGGER_ANNOTATION = "Triggered captures"


def trigger_annotation(kit: PanelKit) -> AnnotationQuery:
    """A marker wherever the recorder took a full capture, titled by its reason."""
    expr = filtered(f"{promql.rate(C.RECORDER_TRIGGERED, by='reason')} > 0")
    return (AnnotationQuery().name(TRIGGER_ANNOTATION).datasource(kit.datasource).enable(True).hide(False)
            .icon_color("red").expr(expr))


def _time(d: Dashboard, kit: PanelKit) -> Dashboard:
    d = d.with_row(kit.row("Where device time goes (sampled windows)"))
    d = d.with_panel(kit.timeseries("Device time by kernel category", [
        Query(C.KERNEL_TIME.rate(by="category"), "{{category}}")], unit="percentunit", width=THIRD, percent=True,
        description=C.KERNEL_TIME.help + " Stacked to 100%: each category's share of sampled time."))
    d = d.with_panel(kit.timeseries("Device time by phase and category", [
        Query(C.KERNEL_TIME.rate(by="phase, category"), "{{phase}} {{category}}")], unit="s", width=THIRD,
        stack=True, description="Sampled seconds per second, by engine phase and kernel category."))
    return d.with_panel(kit.bars("Category share over the range", [
        Query(f"{promql.increase(C.KERNEL_TIME, by='category')} / ignoring(category) group_left "
              f"clamp_min({promql.increase(C.KERNEL_TIME)}, 1e-9)", "{{category}}", instant=True)],
        unit="percentunit", width=THIRD, max_value=1.0,
        description="Each category's share of all sampled device time in the dashboard's range."))


def _gaps(d: Dashboard, kit: PanelKit) -> Dashboard:
    d = d.with_row(kit.row("Gaps and launches"))
    d = d.with_panel(kit.timeseries("Launch-gap share of step time, by phase", [
        Query(C.KERNEL_IDLE.views["gap_share"], "{{phase}}")], unit="percentunit", width=HALF,
        description=C.KERNEL_IDLE.help + " Over the step windows: a high share is launch-bound (CUDA graphs)."))
    return d.with_panel(kit.timeseries("Kernels per step, by phase", [
        Query(C.KERNEL_SAMPLED_STEPS.views["kernels_per_step"], "{{phase}}")], unit="short", width=HALF,
        description=C.KERNEL_ACTIVITIES.help + " Over " + C.KERNEL_SAMPLED_STEPS.help[0].lower()
        + C.KERNEL_SAMPLED_STEPS.help[1:]))


def _roofline(d: Dashboard, kit: PanelKit) -> Dashboard:
    d = d.with_row(kit.row("Roofline (modelled work over sampled time)"))
    d = d.with_panel(kit.timeseries("Achieved FLOP/s, by category", [
        Query(C.KERNEL_ROOF_TIME.views["flops_per_second"], "{{category}}"),
        Query(promql.summed(C.KERNEL_PEAK_FLOPS, by="ceiling, source"), "peak ({{ceiling}}, {{source}})")],
        unit="flops", width=THIRD,
        description=C.KERNEL_FLOPS.help + " Over " + C.KERNEL_ROOF_TIME.help[0].lower() + C.KERNEL_ROOF_TIME.help[1:]
        + " " + C.KERNEL_PEAK_FLOPS.help))
    d = d.with_panel(kit.timeseries("Achieved bandwidth, by category", [
        Query(C.KERNEL_ROOF_TIME.views["bytes_per_second"], "{{category}}"),
        Query(promql.summed(C.KERNEL_PEAK_BYTES, by="ceiling, source"), "peak ({{ceiling}}, {{source}})")],
        unit="Bps", width=THIRD, description=C.KERNEL_BYTES.help + " " + C.KERNEL_PEAK_BYTES.help))
    return d.with_panel(kit.bars("Roofline position: achieved over roof", [
        Query(named_roof_fraction(), "{{category}} (roof: {{ceiling}}, compute {{source}})", instant=True)],
        unit="percentunit", width=THIRD, max_value=1.0,
        description=C.KERNEL_ROOF_FRACTION.help + " Each share names the ceiling it was placed against and "
                    "where the compute peak came from; the bandwidth peak's source is in the bandwidth panel."))


def named_roof_fraction() -> str:
    """Each agent's roof fractions labelled with the ceiling its recorder placed them against: the
    compute peak's (ceiling, source), joined per agent (one ceiling per agent at a time: its last
    window's device). A share without its ceiling is not shown: there is none without one."""
    per_agent = "job, instance"
    roof = f"max by ({per_agent}, ceiling, source) (0 * {C.KERNEL_PEAK_FLOPS.sample} + 1)"
    return (f"max by ({per_agent}, category) ({C.KERNEL_ROOF_FRACTION.sample}) "
            f"* on({per_agent}) group_left(ceiling, source) {roof}")


def _recorder(d: Dashboard, kit: PanelKit) -> Dashboard:
    d = d.with_row(kit.row("The recorder: its cost against its budget, and its captures"))
    d = d.with_panel(kit.timeseries("Recorder cost against budget", [
        Query(C.RECORDER_ENGINE.views["cost_ratio"], "measured (rate interval)"),
        Query(C.RECORDER_COST_RATIO.sample, "measured (since start)"),
        Query(C.RECORDER_BUDGET.sample, "budget")], unit="percentunit", width=THIRD,
        description=C.RECORDER_COST.help + " " + C.RECORDER_BUDGET.help))
    d = d.with_panel(kit.timeseries("Windows, and the interval the budget allows", [
        Query(C.RECORDER_WINDOWS.rate(by="outcome"), "{{outcome}} /s"),
        Query(C.RECORDER_INTERVAL.sample, "interval (engine s)")], unit="short", width=THIRD,
        description=C.RECORDER_WINDOWS.help + " " + C.RECORDER_INTERVAL.help))
    return d.with_panel(kit.bars("Triggered captures by reason", [
        Query(promql.increase(C.RECORDER_TRIGGERED, by="reason"), "{{reason}}", instant=True)], width=THIRD,
        description=C.RECORDER_TRIGGERED.help + " Each is an annotation on the panels; the capture and its "
                    "analysis are at /api/v1/captures with the reason."))


def build(kit: PanelKit) -> Dashboard:
    """The Kernels dashboard's builder."""
    d = base_dashboard(UID, "infersight / Kernels",
                       "Always-on kernel view from the flight recorder's sampled windows, inside its budget.", kit)
    d = d.annotation(trigger_annotation(kit))
    for section in (_time, _gaps, _roofline, _recorder):
        d = section(d, kit)
    return d
