"""The PromQL behind each column of the fleet table, built from the metric catalogue's MetricSpecs
(no metric name is typed here). Every query aggregates `by (node, model)` at one instant over the
window `[since]`, so Prometheus computes every figure; the labels come from FleetConfig.

A column's query is one of three shapes:
  rate      sum by (node, model) (rate(counter[since]))                 per second over the window
  ratio     sum by (...) (rate(a[since])) / sum by (...) (rate(b[since]))
  quantile  histogram_quantile(q, sum by (node, model, le) (rate(h_bucket[since])))
            an estimate: Prometheus interpolates linearly inside the bucket the quantile falls in
"""
from __future__ import annotations

from dataclasses import dataclass

from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec
from infersight.fleet.config import FleetConfig

MEASURED = "measured"
#: histogram_quantile's answer: measured bucket counts, the quantile placed inside its bucket by
#: linear interpolation.
ESTIMATED = "measured buckets, quantile interpolated within a bucket"


#: The latency quantile columns: (histogram, quantile) each is histogram_quantile over (the outlier
#: judge reads them at their histograms' buckets, fleet.outliers).
QUANTILE_COLUMNS: dict[str, tuple[MetricSpec, float]] = {
    f"{short}_{tag}_s": (spec, q) for spec, short in ((C.TTFT, "ttft"), (C.ITL, "itl"), (C.E2E, "e2e"))
    for tag, q in (("p50", 0.5), ("p99", 0.99))}


@dataclass(frozen=True)
class ColumnQuery:
    """One column of the table: its PromQL, unit, provenance and what it is."""

    column: str
    expr: str
    unit: str
    provenance: str
    help: str


class FleetQueries:
    """PromQL for one config: `by` is the node and model labels, `window` the config's since."""

    def __init__(self, config: FleetConfig, extra_by: tuple[str, ...] = ()) -> None:
        self.node, self.model = config.node_label, config.model_label
        self.window = config.since
        self.keys = (self.node, self.model, *extra_by)

    def _by(self, *more: str) -> str:
        return f"by ({', '.join(self.keys + more)})"

    def rate(self, spec: MetricSpec, *more: str, matchers: str = "", series: str = "") -> str:
        name = series or spec.sample
        selector = f"{name}{{{matchers}}}" if matchers else name
        return f"sum {self._by(*more)} (rate({selector}[{self.window}]))"

    def increase(self, spec: MetricSpec, *more: str) -> str:
        return f"sum {self._by(*more)} (increase({spec.sample}[{self.window}]))"

    def or_zero(self, expr: str) -> str:
        """An event counter a node never incremented has no series at all; a node that ran engine
        steps in the window and has none had 0 such events, not unknown ones."""
        return f"({expr})\nor\n(0 * sum {self._by()} (rate({C.STEPS.sample}[{self.window}])))"

    def ratio(self, num: str, den: str) -> str:
        return f"({num})\n/\n({den})"

    def quantile(self, spec: MetricSpec, q: float) -> str:
        return f"histogram_quantile({q:g}, sum {self._by('le')} (rate({spec.name}_bucket[{self.window}])))"

    def bucket_bounds(self, spec: MetricSpec) -> str:
        """One series per (node, model, le) of the histogram in the window: its bucket bounds as each node's
        series hold them (the outlier judge's resolution of a quantile, fleet.outliers)."""
        return f"group {self._by('le')} (last_over_time({spec.name}_bucket[{self.window}]))"

    def phase_share(self, phase: str) -> str:
        total = self.rate(C.PHASE, series=C.PHASE.name + "_sum")
        return self.ratio(self.rate(C.PHASE, matchers=f'phase="{phase}"', series=C.PHASE.name + "_sum"), total)

    def gauge_mean(self, spec: MetricSpec) -> str:
        """The gauge's mean over the window's scrapes, the node's replicas' largest."""
        return f"max {self._by()} (avg_over_time({spec.sample}[{self.window}]))"

    def agent_targets(self) -> str:
        """One series per (node, model, instance): the agent targets that scraped engine steps in the
        window. `instance` is the agent's HOST:PORT (its /metrics and its JSON API)."""
        return f"group by ({', '.join(self.keys)}, instance) (last_over_time({C.STEPS.sample}[{self.window}]))"

    def columns(self) -> list[ColumnQuery]:
        """The table's columns in display order (table.COLUMNS documents the same names)."""
        cols = [ColumnQuery("request_rate", self.rate(C.REQUESTS), "1/s", MEASURED, "finished requests per second"),
                ColumnQuery("requests", self.increase(C.REQUESTS), "count", MEASURED,
                            "finished requests in the window (what a share of requests is counted on)")]
        for column, (spec, q) in QUANTILE_COLUMNS.items():
            short, tag, _ = column.split("_")
            cols.append(ColumnQuery(column, self.quantile(spec, q), "s", ESTIMATED,
                                    f"{short.upper()} {tag} from {spec.name}"))
        cols += [
            ColumnQuery("queue_share", self.phase_share("queue"), "ratio", MEASURED,
                        "share of request time spent queued (request_phase_seconds)"),
            ColumnQuery("preemptions_per_request",
                        self.ratio(self.or_zero(self.rate(C.PREEMPTIONS)), self.rate(C.REQUESTS)), "ratio", MEASURED,
                        "preemptions per finished request"),
            ColumnQuery("preemptions", self.or_zero(self.increase(C.PREEMPTIONS)), "count", MEASURED,
                        "preemptions in the window"),
            ColumnQuery("kv_usage_ratio", self.gauge_mean(C.KV_USAGE), "ratio", MEASURED,
                        "KV blocks in use, mean of the window's scrapes"),
            ColumnQuery("prefix_hit_rate", self.ratio(self.rate(C.PREFIX_HIT), self.rate(C.PREFIX_QUERIED)),
                        "ratio", MEASURED, "prompt tokens served from the prefix cache"),
            ColumnQuery("spec_accept_rate", self.ratio(self.rate(C.SPEC_ACCEPTED), self.rate(C.SPEC_DRAFT)),
                        "ratio", MEASURED, "draft tokens accepted, all tasks"),
            ColumnQuery("energy_per_output_token_j",
                        self.ratio(self.rate(C.ENERGY), self.rate(C.GENERATION_TOKENS)), "J", MEASURED,
                        "GPU energy of the requests' steps per output token (no GPU counter: empty)"),
            ColumnQuery("slow_share", self.ratio(self.or_zero(self.rate(C.SLOW)), self.rate(C.REQUESTS)), "ratio",
                        MEASURED, "requests the agent flagged slow, per finished request"),
            ColumnQuery("probe_events_dropped", self.or_zero(self.increase(C.PROBE_DROPPED)), "count", MEASURED,
                        "probe ring slots dropped (ring full) in the window"),
        ]
        return cols

    def spec_by_task(self) -> str:
        return self.ratio(self.rate(C.SPEC_ACCEPTED, "task"), self.rate(C.SPEC_DRAFT, "task"))

    def slow_causes(self) -> str:
        return self.increase(C.SLOW, "cause")

    def expert_tokens(self) -> str:
        return self.increase(C.EXPERT_TOKENS, "layer", "expert")
