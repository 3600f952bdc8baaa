"""The Overview dashboard: traffic, latency quantiles (with exemplars, so a slow bucket links to
the trace of a request in it), where request time goes, and why requests were slow."""
from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from infersight.dashboards.grafana import promql
from infersight.dashboards.grafana.panels import FULL, HALF, THIRD, PanelKit, Query, base_dashboard
from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec

UID = "infersight-overview"


def _quantiles(spec: MetricSpec) -> list[Query]:
    """The spec's p50/p90/p99 views, exemplars on: Prometheus returns the trace ids stored on
    the buckets, and Grafana draws them as points linking to the trace."""
    return [Query(expr, legend=name, exemplar=True) for name, expr in sorted(spec.views.items())]


def build(kit: PanelKit) -> Dashboard:
    """The Overview dashboard's builder (its panels query kit's datasource)."""
    d = base_dashboard(UID, "infersight / Overview",
                       "Request traffic and latency of the observed engine, and where the time goes.", kit)
    d = d.with_row(kit.row("Traffic"))
    d = d.with_panel(kit.timeseries("Finished requests by task", [
        Query(C.REQUESTS.rate(by="task"), "{{task}}")], unit="reqps", width=THIRD, stack=True))
    d = d.with_panel(kit.timeseries("Tokens per second", [
        Query(C.PROMPT_TOKENS.rate(), "prompt"), Query(C.GENERATION_TOKENS.rate(), "generated")],
        unit="short", width=THIRD))
    d = d.with_panel(kit.timeseries("Scheduler queues", [
        Query(C.REQUESTS_RUNNING.sample, "running"), Query(C.REQUESTS_WAITING.sample, "waiting"),
        Query(C.REQUESTS_SWAPPED.sample, "swapped to CPU")], unit="short", width=THIRD,
        description="Requests in the running batch, waiting to be scheduled, and preempted with "
                    "their KV in the CPU tier, at the engine's last step."))

    d = d.with_row(kit.row("Latency"))
    d = d.with_panel(kit.timeseries("Time to first token", _quantiles(C.TTFT), unit="s", width=THIRD,
                                    description=C.TTFT.help + " Points are exemplars: click one for its trace."))
    d = d.with_panel(kit.timeseries("Inter-token latency", _quantiles(C.ITL), unit="s", width=THIRD,
                                    description=C.ITL.help))
    d = d.with_panel(kit.timeseries("End-to-end latency", _quantiles(C.E2E), unit="s", width=THIRD,
                                    description=C.E2E.help + " Points are exemplars: click one for its trace."))

    d = d.with_row(kit.row("Where the time goes"))
    d = d.with_panel(kit.timeseries("Request time by phase", [
        Query(C.PHASE.views["share"], "{{phase}}")], unit="s", width=HALF, stack=True,
        description="Seconds of request time per second of wall time, stacked by phase. The phases "
                    "of a request (" + ", ".join(C.PHASES) + ") sum to its end-to-end latency."))
    d = d.with_panel(kit.timeseries("Share of request time by phase", [
        Query(C.PHASE.views["share"], "{{phase}}")], unit="percentunit", width=HALF, percent=True))

    d = d.with_row(kit.row("Slow requests"))
    d = d.with_panel(kit.timeseries("Slow requests by cause", [
        Query(C.SLOW.rate(by="cause"), "{{cause}}")], unit="reqps", width=HALF, stack=True,
        description=C.SLOW.help))
    d = d.with_panel(kit.bars("Slow requests by cause, over the time range", [
        Query(promql.increase(C.SLOW, by="cause"), "{{cause}}", instant=True)], width=HALF))

    d = d.with_row(kit.row("Probes"))
    d = d.with_panel(kit.timeseries("Probe ring slots", [
        Query(C.PROBE_EVENTS.rate(by="ring"), "produced {{ring}}"),
        Query(C.PROBE_DROPPED.rate(by="ring"), "dropped {{ring}}"),
        Query(C.PROBE_CORRUPT.rate(by="ring"), "corrupt {{ring}}")], unit="short", width=FULL,
        description="Events per second the engine's probes wrote, and those lost to a full ring or "
                    "skipped as corrupt (both should stay at 0)."))
    return d
