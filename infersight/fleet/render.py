"""FleetReport as text (for people), JSON (for programs; NaN as null) and HTML (one page)."""
from __future__ import annotations

import datetime as dt
import html
import json
import math
from typing import Any

import pandas as pd

from infersight.fleet.queries import ESTIMATED, QUANTILE_COLUMNS
from infersight.fleet.report import FleetReport
from infersight.fleet.table import KEYS


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _clean(value.item())
    return value


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [_clean(r) for r in frame.to_dict(orient="records")]


def evidence(report: FleetReport, node: str, model: str) -> pd.DataFrame:
    """The flagged columns of one (node, model): column, value, peer_median, difference (what z is taken
    on: for a latency quantile the smallest difference its buckets allow), z, worst first."""
    s = report.scores
    mine = s[(s["node"] == node) & (s["model"] == model) & s["flagged"]]
    columns = ["column", "value", "peer_median", "difference", "z"]
    return mine.sort_values("z", ascending=False)[columns].reset_index(drop=True)


def _when(report: FleetReport) -> str:
    return dt.datetime.fromtimestamp(report.evaluated_at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_dict(report: FleetReport) -> dict[str, Any]:
    c = report.config
    outs = []
    for row in _records(report.outliers):
        outs.append({**row, "evidence": _records(evidence(report, row["node"], row["model"])),
                     "slowest_requests": report.links.get((row["node"], row["model"]), [])})
    return {
        "prometheus_url": c.prometheus_url, "window": c.since, "evaluated_at": _when(report),
        "node_label": c.node_label, "model_label": c.model_label,
        "provenance": "every figure is measured: computed by Prometheus from the agents' series over the window; "
                      "p50/p99 are estimates (histogram_quantile interpolates linearly within a bucket)",
        "columns": [{"name": q.column, "unit": q.unit, "provenance": q.provenance, "help": q.help, "promql": q.expr}
                    for q in report.columns],
        "table": _records(report.table), "outlier_statistic": report.statistic, "outliers": outs,
        "slow_cause_mix": _records(report.slow_mix), "spec_accept_by_task": _records(report.spec_by_task),
        "hottest_experts": _records(report.experts),
    }


def to_json(report: FleetReport) -> str:
    return json.dumps(to_dict(report), indent=1, allow_nan=False)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.3g}"
    return str(value)


def _grid(frame: pd.DataFrame, columns: list[str], headers: list[str] | None = None) -> list[str]:
    headers = headers or columns
    cells = [[_fmt(v) for v in row] for row in frame[columns].itertuples(index=False)]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(vals: list[str]) -> str:  # the keys left-aligned, the figures right-aligned
        return "  ".join(v.rjust(w) if i >= 2 else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths)))

    return [line(headers), *(line(r) for r in cells)]


def _outlier_lines(report: FleetReport) -> list[str]:
    if report.outliers.empty:
        return ["  none: no node stands out from its peers on a latency symptom"]
    lines = []
    for row in report.outliers.itertuples(index=False):
        ev = evidence(report, row.node, row.model)
        said = "; ".join(f"{e.column} {_fmt(e.value)} vs peers' median {_fmt(e.peer_median)} (z {_fmt(e.z)}"
                         + (f", at least {_fmt(e.difference)} above by the buckets)" if e.column in QUANTILE_COLUMNS
                            else ")") for e in ev.itertuples(index=False))
        lines.append(f"  OUTLIER node {row.node} model {row.model or '-'}: cause {row.cause}"
                     f" ({row.cause_from or 'no cause stands out'})")
        lines.append(f"    evidence: {said}")
        if row.top_slow_cause:
            lines.append(f"    its slow requests' top cause (agent attribution): {row.top_slow_cause} "
                         f"({_fmt(100 * row.top_slow_cause_share)}%)")
        for link in report.links.get((row.node, row.model), []) or ["(no agent target found for it)"]:
            lines.append(f"    slowest requests: {link}")
    return lines


def to_text(report: FleetReport) -> str:
    c = report.config
    cols = [q.column for q in report.columns]
    estimated = [q.column for q in report.columns if q.provenance == ESTIMATED]
    out = [f"fleet at {c.prometheus_url}: window {c.since} ending {_when(report)}; nodes by label "
           f"{c.node_label!r}, models by {c.model_label!r}",
           "Every figure is measured (computed by Prometheus from the agents' series over the window); "
           f"{', '.join(estimated)} are estimates from histogram buckets (linear interpolation within a bucket).",
           "", "node x model:"]
    out += ["  " + line for line in _grid(report.table, [*KEYS, *cols])]
    out += ["", f"outliers ({report.statistic}):", *_outlier_lines(report)]
    if not report.slow_mix.empty:
        out += ["", "slow-cause mix (slow requests in the window, by the agent's attributed cause):"]
        out += ["  " + line for line in _grid(report.slow_mix, [*KEYS, "cause", "count", "share"])]
    if not report.spec_by_task.empty:
        out += ["", "speculation acceptance by task:"]
        out += ["  " + line for line in _grid(report.spec_by_task, [*KEYS, "task", "accept_rate"])]
    if not report.experts.empty:
        out += ["", "hottest experts across nodes (tokens routed in the window):"]
        out += ["  " + line for line in _grid(report.experts, list(report.experts.columns))]
    return "\n".join(out)


def _html_table(frame: pd.DataFrame, mark: set[tuple[str, str]] | None = None) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for rec in frame.itertuples(index=False):
        key = (str(rec[0]), str(rec[1])) if len(rec) > 1 else None
        cls = ' class="outlier"' if mark and key in mark else ""
        rows.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in rec) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def to_html(report: FleetReport) -> str:
    marked = {(r.node, r.model) for r in report.outliers.itertuples(index=False)}
    items = []
    for line in _outlier_lines(report):
        text = html.escape(line.strip())
        for links in report.links.values():
            for link in links:
                text = text.replace(html.escape(link), f'<a href="{html.escape(link)}">{html.escape(link)}</a>')
        items.append(f"<li>{text}</li>")
    sections = [("node x model", _html_table(report.table, marked)),
                ("outliers: " + report.statistic, f"<ul>{''.join(items)}</ul>"),
                ("slow-cause mix", _html_table(report.slow_mix)),
                ("speculation acceptance by task", _html_table(report.spec_by_task)),
                ("hottest experts across nodes", _html_table(report.experts))]
    body = "".join(f"<h2>{html.escape(t)}</h2>{s}" for t, s in sections)
    first = html.escape(to_text(report).splitlines()[1])
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>infersight fleet</title><style>"
            f"td,th{{padding:2px 8px;text-align:right}}tr.outlier{{background:#fdd}}</style></head><body>"
            f"<h1>infersight fleet: {html.escape(report.config.prometheus_url)}, window "
            f"{html.escape(report.config.since)} ending {_when(report)}</h1><p>{first}</p>{body}</body></html>")


RENDERERS = {"text": to_text, "json": to_json, "html": to_html}
