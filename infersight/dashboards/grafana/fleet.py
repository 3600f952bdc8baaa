"""The Fleet overview dashboard: one row per node (engine instance, model), the outliers first, then
each signal drawn per node on one time axis.

The table ranks rows by a robust deviation, the modified z-score `infersight fleet` uses
(infersight.fleet.outliers: Iglewicz and Hoaglin), computed by Prometheus over the dashboard's
range for each of the latency p99s (TTFT, ITL, end-to-end) and the worst of the three kept:

    z = (x - median) / max(1.4826 * MAD, 0.1 * |median|, 1e-12)      among the rows serving the same model

One difference, said here: PromQL has no leave-one-out, so the median and MAD include the row itself.
With three or more nodes both still ignore one outlier (the median of 3 is a peer's value); with
one node every z is 0. And the table's z is taken on the quantiles' readings, while the fleet command
judges a quantile on the smallest difference its histogram buckets allow (a bucket's bounds are not
an instant vector PromQL can join): the table ranks, a healthy row a bucket apart may read above 3.5
there; the fleet command says which rows stand out, and why.
"""
from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from infersight.dashboards.grafana.panels import FULL, THIRD, PanelKit, Query, base_dashboard
from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec

UID = "infersight-fleet"
TABLE_TITLE = "Nodes, outliers first"
DEVIATION = "Deviation (robust z, worst p99)"
#: What makes a row: the target labels of an agent (Kubernetes or an agent-mode Prometheus's
#: `node`), its agent target and the model. Labels a fleet lacks drop out of the grouping.
ROW_KEYS = ("namespace", "node", "pod", "instance", C.MODEL_LABEL)
#: The modified z-score's constants (as infersight.fleet.outliers; dashboards may not import it).
MAD_TO_SIGMA, RELATIVE_FLOOR, SCALE_FLOOR = 1.4826, 0.1, 1e-12
#: The symptoms judged: (column name, histogram).
SYMPTOMS = (("TTFT p99", C.TTFT), ("ITL p99", C.ITL), ("E2E p99", C.E2E))
LEGEND = "{{node}}{{pod}} {{instance}} {{" + C.MODEL_LABEL + "}}"


def _by(*more: str) -> str:
    return f"by ({', '.join((*ROW_KEYS, *more))})"


def p99(spec: MetricSpec, window: str) -> str:
    return f"histogram_quantile(0.99, sum {_by('le')} (rate({spec.name}_bucket[{window}])))"


def queue_share(window: str) -> str:
    """Share of request time spent queued (the phase histogram's sums)."""
    phase = C.PHASE.name + "_sum"
    return (f'sum {_by()} (rate({phase}{{phase="queue"}}[{window}])) '
            f"/ clamp_min(sum {_by()} (rate({phase}[{window}])), 1e-9)")


def preemptions(window: str, how: str = "increase") -> str:
    """Preemptions in the window; a node that stepped and never preempted has no series: 0 there."""
    return (f"sum {_by()} ({how}({C.PREEMPTIONS.sample}[{window}])) "
            f"or 0 * sum {_by()} ({how}({C.STEPS.sample}[{window}]))")


def kv_usage(window: str) -> str:
    return f"max {_by()} (avg_over_time({C.KV_USAGE.sample}[{window}]))"


def robust_z(x: str) -> str:
    """Each row's modified z-score of x among the rows serving the same model (module docstring)."""
    model = C.MODEL_LABEL
    med = f"quantile by ({model}) (0.5, {x})"
    # group_left() with its empty list written out: a "(" after group_left would be read as its labels.
    dev = f"({x}) - on({model}) group_left() ({med})"
    mad = f"quantile by ({model}) (0.5, abs({dev}))"
    floor = f"({RELATIVE_FLOOR} * abs({med}))"
    scale = f"clamp_min((({MAD_TO_SIGMA} * {mad}) > {floor}) or {floor}, {SCALE_FLOOR})"
    return f"({dev}) / on({model}) group_left() ({scale})"


def deviation(window: str) -> str:
    """The worst of the symptoms' z-scores per row (each tagged, so `or` keeps all three)."""
    tagged = " or ".join(f'label_replace({robust_z(p99(spec, window))}, "signal", "{name}", "", "")'
                         for name, spec in SYMPTOMS)
    return f"max {_by()} ({tagged})"


def table_columns(window: str = "$__range") -> list[tuple[str, str, Query]]:
    """(column, unit, instant table query) of the outlier table, the deviation first (refId A)."""
    cols = [(DEVIATION, "short", deviation(window))]
    cols += [(name, "s", p99(spec, window)) for name, spec in SYMPTOMS]
    cols += [("Queue share", "percentunit", queue_share(window)),
             ("Preemptions", "short", preemptions(window)),
             ("KV usage (mean)", "percentunit", kv_usage(window))]
    return [(name, unit, Query(expr, instant=True, table=True)) for name, unit, expr in cols]


def build(kit: PanelKit) -> Dashboard:
    """The Fleet overview's builder: the outlier table, then each signal per node."""
    d = base_dashboard(UID, "infersight / Fleet overview",
                       "Every node side by side, the outliers first: which node is slow, and what it shows.", kit)
    d = d.with_row(kit.row("Outliers"))
    d = d.with_panel(kit.table(TABLE_TITLE, table_columns(), width=FULL, sort_desc=DEVIATION, description=(
        "One row per node, engine instance and model over the dashboard's range, sorted by the robust "
        "deviation of its worst latency p99 from the other rows of its model (modified z-score on the "
        "quantiles' readings; above 3.5 it stands out). `infersight fleet` judges each quantile at its "
        "histogram buckets' resolution and names the cause.")))
    rate = "$__rate_interval"
    d = d.with_row(kit.row("Per node"))
    for name, spec in SYMPTOMS:
        d = d.with_panel(kit.timeseries(f"{name} by node", [Query(p99(spec, rate), LEGEND)], unit="s", width=THIRD,
                                        description=spec.help))
    d = d.with_panel(kit.timeseries("Queue share by node", [Query(queue_share(rate), LEGEND)],
                                    unit="percentunit", width=THIRD,
                                    description="Share of request time spent waiting to be scheduled."))
    d = d.with_panel(kit.timeseries("Preemptions by node", [Query(preemptions(rate, how="rate"), LEGEND)],
                                    unit="ops", width=THIRD, description=C.PREEMPTIONS.help))
    return d.with_panel(kit.timeseries("KV usage by node", [Query(kv_usage(rate), LEGEND)], unit="percentunit",
                                       width=THIRD, description=C.KV_USAGE.help))
