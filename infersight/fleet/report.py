"""FleetReport: every query run once against one Prometheus at one instant, then the pure analyses
(table, outliers, experts) over their answers. The only I/O is PrometheusAPI.query."""
from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from infersight.fleet.config import FleetConfig
from infersight.fleet.experts import hottest_experts
from infersight.fleet.outliers import Z_CUT, outliers, scores
from infersight.fleet.prometheus_api import PrometheusAPI, PrometheusError, Sample
from infersight.fleet.queries import QUANTILE_COLUMNS, ColumnQuery, FleetQueries
from infersight.fleet.table import KEYS, mix, node_table


@dataclass
class FleetReport:
    """What `infersight fleet` shows. Frames (columns documented in their modules):
    table (table.node_table), spec_by_task (node, model, task, accept_rate), slow_mix (node, model,
    cause, count, share: table.mix), scores and outliers (outliers.py), experts (experts.py), buckets
    (node, model, column, le: the histogram bounds each node's quantiles were judged at).
    links: (node, model) of each outlier -> its agent's slowest-requests URL, built from the agent
    target's `instance` label (HOST:PORT of the agent's /metrics, which serves its JSON API too)."""

    config: FleetConfig
    evaluated_at: float
    columns: list[ColumnQuery]
    table: pd.DataFrame
    spec_by_task: pd.DataFrame
    slow_mix: pd.DataFrame
    scores: pd.DataFrame
    outliers: pd.DataFrame
    experts: pd.DataFrame
    links: dict[tuple[str, str], list[str]]
    buckets: pd.DataFrame

    @property
    def statistic(self) -> str:
        return (f"modified z-score (Iglewicz-Hoaglin) against the other nodes' median and MAD, scale floored at "
                f"10% of their median, flagged above {Z_CUT:g}; a latency quantile by the smallest difference "
                f"its histogram buckets allow")


def _frame(samples: list[Sample], config: FleetConfig, extra: dict[str, str]) -> pd.DataFrame:
    """Samples -> node, model, <extra columns from labels>, value."""
    rows = [{"node": s.labels.get(config.node_label, ""), "model": s.labels.get(config.model_label, ""),
             **{col: s.labels.get(label, "") for col, label in extra.items()}, "value": s.value} for s in samples]
    return pd.DataFrame(rows, columns=[*KEYS, *extra, "value"])


def agent_link(config: FleetConfig, instance: str) -> str:
    return f"{config.agent_scheme}://{instance}/api/v1/requests?slowest={config.slowest}"


def _buckets(api: PrometheusAPI, q: FleetQueries, config: FleetConfig, at: float) -> pd.DataFrame:
    """node, model, column, le: each quantile column's histogram bounds per node (outliers.scores)."""
    bounds: dict[str, pd.DataFrame] = {}
    frames = []
    for column, (spec, _) in QUANTILE_COLUMNS.items():
        if spec.name not in bounds:
            found = _frame(api.query(q.bucket_bounds(spec), at), config, {"le": "le"})
            bounds[spec.name] = found.assign(le=pd.to_numeric(found["le"], errors="coerce")).dropna(subset=["le"])
        frames.append(bounds[spec.name][[*KEYS, "le"]].assign(column=column))
    return pd.concat(frames, ignore_index=True)


def build_report(api: PrometheusAPI, config: FleetConfig, at: float | None = None) -> FleetReport:
    """Raises PrometheusError when a query fails, or when the window holds no engine series at all."""
    at = time.time() if at is None else at
    q = FleetQueries(config)
    columns = q.columns()
    answers = pd.concat([_frame(api.query(c.expr, at), config, {}).assign(column=c.column) for c in columns],
                        ignore_index=True)
    agents = _frame(api.query(q.agent_targets(), at), config, {"instance": "instance"})
    if answers.empty and agents.empty:
        raise PrometheusError(f"{config.prometheus_url}: no infersight engine series in the last {config.since} "
                              f"(is it the Prometheus the agents' series reach?)")
    table = node_table(answers, [c.column for c in columns], agents)
    spec = _frame(api.query(q.spec_by_task(), at), config, {"task": "task"}).rename(columns={"value": "accept_rate"})
    causes = _frame(api.query(q.slow_causes(), at), config, {"cause": "cause"}).rename(columns={"value": "count"})
    slow_mix = mix(causes, "cause")
    buckets = _buckets(api, q, config, at)
    judged = scores(table, buckets)
    found = outliers(judged, slow_mix)
    tokens = _frame(api.query(q.expert_tokens(), at), config, {"layer": "layer", "expert": "expert"})
    experts = hottest_experts(tokens.rename(columns={"value": "tokens"}), config.top_experts)
    links: dict[tuple[str, str], list[str]] = {}
    for node, model in found[KEYS].itertuples(index=False):
        row = table[(table["node"] == node) & (table["model"] == model)]
        instances = [i for i in ",".join(row["instance"]).split(",") if i]
        links[(node, model)] = [agent_link(config, i) for i in instances]
    return FleetReport(config, at, columns, table, spec.sort_values([*KEYS, "task"]).reset_index(drop=True),
                       slow_mix, judged, found, experts, links, buckets)
