"""`infersight compare`'s result (correlate.run_compare) as a text table and as an HTML page.

Both are drawn from the same rows (comparison_rows): section, figure, A, B, B - A, the 95% interval
and the verdict, each figure in its unit (latencies in ms, shares and rates in %). The HTML page uses
the report's style (page.STYLE) and, like the report, opens from file:// and fetches nothing. Each
section's basis (measured or modelled) follows its rows.
"""
from __future__ import annotations

import html
from typing import Any

from infersight.dashboards.report.page import STYLE

HEADER = ("section", "figure", "A", "B", "B - A", "95% interval", "verdict")
Row = tuple[str, str, str, str, str, str, str]


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v * 1e3:.2f} ms"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:.1%}"


def _pp(v: Any) -> str:  # a difference of shares, in percentage points
    return "-" if v is None else f"{v * 100:+.1f} pp"


def _plain(v: Any) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, int) else f"{v:.3g}"


def _signed(v: Any) -> str:
    return "-" if v is None else f"{v:+.3g}"


def _pair_row(section: str, figure: str, pair: dict[str, Any], fmt: Any = _plain, diff: Any = _signed) -> Row:
    if "absent" in pair:
        return (section, figure, "", "", "", "", pair["absent"])
    return (section, figure, fmt(pair["a"]), fmt(pair["b"]), diff(pair["b_minus_a"]), "", "")


def _latency_rows(latency: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for metric, quantiles in latency.items():
        for key, d in quantiles.items():
            if "absent" in d:
                rows.append(("latency", f"{metric} {key}", "", "", "", "", d["absent"]))
                continue
            interval = d.get("interval_95")
            span = "" if not interval else f"[{interval[0] * 1e3:+.2f}, {interval[1] * 1e3:+.2f}] ms"
            diff = "-" if d["b_minus_a"] is None else f"{d['b_minus_a'] * 1e3:+.2f} ms"
            rows.append(("latency", f"{metric} {key}", _ms(d["a"]), _ms(d["b"]), diff, span, d["verdict"]))
    return rows


def _section_rows(result: dict[str, Any], section: str, fmt: Any, diff: Any) -> list[Row]:
    doc = result[section]
    if "absent" in doc:
        return [(section, "", "", "", "", "", doc["absent"])]
    return [_pair_row(section, name, pair, fmt, diff) for name, pair in doc.items()]


def comparison_rows(result: dict[str, Any]) -> list[Row]:
    """The result as table rows (HEADER's columns), in the result's section order."""
    rows = _latency_rows(result["latency"])
    rows += _section_rows(result, "phase_shares", _pct, _pp)
    rows += _section_rows(result, "prefix_cache", _pct, _pp)
    rows += _section_rows(result, "kv", _plain, _signed)
    load = result["expert_load"]
    if "absent" in load:
        rows.append(("expert_load", "", "", "", "", "", load["absent"]))
    else:
        for layer in load["layers"]:
            name = f"layer {layer['layer']} max/mean"
            if "absent" in layer:
                rows.append(("expert_load", name, "", "", "", "", layer["absent"]))
                continue
            rows.append(("expert_load", name, f"{_plain(layer['max_over_mean_a'])} ({layer['tokens_a']} tok)",
                         f"{_plain(layer['max_over_mean_b'])} ({layer['tokens_b']} tok)",
                         _signed(layer["b_minus_a"]), "", ""))
    spec = result["speculation"]
    if "absent" in spec:
        rows.append(("speculation", "", "", "", "", "", spec["absent"]))
    else:
        for task, figures in spec.items():
            if "absent" in figures:
                rows.append(("speculation", task, "", "", "", "", figures["absent"]))
                continue
            rows.append(_pair_row("speculation", f"{task} accept_rate", figures["accept_rate"], _pct, _pp))
            rows.append(_pair_row("speculation", f"{task} mean_accepted_length", figures["mean_accepted_length"]))
            rows.append(_pair_row("speculation", f"{task} predicted_speedup (modelled)",
                                  figures["predicted_speedup"]))
    return rows


def _title(result: dict[str, Any]) -> str:
    def run(r: dict[str, Any]) -> str:
        rows = "summary only" if r["rows"] is None else f"{r['rows']} request rows"
        return f"{r['name']} ({r['requests']} requests, {rows})"
    return f"A = {run(result['a'])}, B = {run(result['b'])}"


def text_table(result: dict[str, Any]) -> str:
    """A fixed-width table with the bases below it."""
    rows = [HEADER, *comparison_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = [_title(result), ""]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines += ["", "basis:"] + [f"  {section}: {text}" for section, text in result["basis"].items()]
    return "\n".join(lines) + "\n"


def compare_html(result: dict[str, Any]) -> str:
    """A self-contained HTML page: one table per section, its basis under it."""
    body = ["<h1>infersight compare</h1>", f'<p class="meta">{html.escape(_title(result))}</p>']
    by_section: dict[str, list[Row]] = {}
    for r in comparison_rows(result):
        by_section.setdefault(r[0], []).append(r)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER[1:])
    for section, rows in by_section.items():
        cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r[1:]) + "</tr>" for r in rows)
        body += [f"<h2>{html.escape(section.replace('_', ' '))}</h2>",
                 f'<table class="summary" id="compare-{section}"><tr>{head}</tr>{cells}</table>',
                 f'<p class="note">{html.escape(result["basis"].get(section, ""))}</p>']
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>infersight compare</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n")
