"""The report page: one HTML document with its style inline and every figure embedded as a
base64 PNG, so it opens from file:// anywhere and fetches nothing."""
from __future__ import annotations

import base64
import html
from typing import Any

from infersight.dashboards.report.figures import ReportFigure

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1100px;
       color: #222; background: #fff; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.25rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2rem; }
h3 { font-size: 1.05rem; margin-bottom: 0.3rem; }
table.summary { border-collapse: collapse; margin: 1rem 0; }
table.summary th { text-align: left; padding: 0.2rem 1.2rem 0.2rem 0; color: #555; font-weight: 600; }
table.summary td { padding: 0.2rem 0; }
figure { margin: 0 0 1.5rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption, .meta { color: #555; font-size: 0.9rem; }
p.note { background: #f6f6f6; border-left: 4px solid #bbb; padding: 0.5rem 0.8rem; color: #444; }
"""


def _ms(value: Any) -> str:
    return "-" if value is None else f"{float(value) * 1e3:.1f} ms"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1%}"


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines for the header, from the agent's summary document (keys may be absent)."""
    get = (lambda *keys: _dig(summary, keys))
    rows = [("requests", str(get("requests"))),
            ("TTFT p50 / p99", f"{_ms(get('ttft_seconds', 'p50'))} / {_ms(get('ttft_seconds', 'p99'))}"),
            ("e2e p50 / p99", f"{_ms(get('e2e_seconds', 'p50'))} / {_ms(get('e2e_seconds', 'p99'))}"),
            ("mean inter-token p50 / p99",
             f"{_ms(get('itl_mean_seconds', 'p50'))} / {_ms(get('itl_mean_seconds', 'p99'))}")]
    phases = get("phases_seconds_total") or {}
    total = sum(v for v in phases.values() if v) or 0.0
    if total:
        rows.append(("request time by phase", ", ".join(f"{p} {(v or 0.0) / total:.0%}" for p, v in phases.items())))
    rows.append(("prefix-cache hit rate", f"tokens {_pct(get('prefix_cache', 'token_hit_rate'))}, "
                                          f"requests {_pct(get('prefix_cache', 'request_hit_rate'))}"))
    kv = get("kv") or {}
    if kv:
        rows.append(("KV cache", f"{kv.get('preemptions')} preemptions, {kv.get('evictions')} evictions, "
                                 f"{kv.get('offloads')} offloads, {kv.get('recomputed_tokens')} tokens recomputed"))
    layers = get("moe", "layers") or []
    if layers:
        rows.append(("MoE max/mean load", ", ".join(
            f"L{x['layer']} {x['max_over_mean']:.2f}x" if x.get("max_over_mean") is not None else f"L{x['layer']} -"
            for x in layers)))
    for task, s in sorted((get("spec", "by_task") or {}).items()):
        speed = s.get("predicted_speedup")
        rows.append((f"speculation, {task}", f"accept {_pct(s.get('accept_rate'))}, predicted speedup "
                                              f"{'-' if speed is None else f'{speed:.2f}x'}"))
    engine = get("cost", "engine_seconds_by_task") or {}
    if engine:
        rows.append(("engine step time by task", ", ".join(f"{t} {v:.2f} s" for t, v in sorted(engine.items()))))
    energy = get("cost", "energy") or {}
    if energy:
        by_task = get("cost", "energy_j_by_task") or {}
        per_task = f"; {', '.join(f'{t} {v:.1f} J' for t, v in sorted(by_task.items()))}" if by_task else ""
        rows.append(("GPU energy", f"{energy.get('headline', '-')}{per_task}"))
    causes = get("slow_causes") or {}
    if causes:
        rule = f" ({get('slow_rule')})" if get("slow_rule") else ""
        rows.append((f"slow requests by cause{rule}", ", ".join(f"{c} {n}" for c, n in sorted(causes.items()))))
    rows.append(("dropped probe events", str(get("dropped_events"))))
    return rows


def _dig(doc: dict[str, Any], keys: tuple[str, ...]) -> Any:
    cur: Any = doc
    for k in keys:
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return cur


def _figure(fig: ReportFigure) -> str:
    title = html.escape(fig.title)
    if fig.png is None:
        note_id = "note-" + fig.id.removeprefix("fig-")
        return (f'<section class="figure skipped"><h3>{title}</h3>'
                f'<p class="note" id="{note_id}">Skipped: {html.escape(fig.note)}</p></section>')
    data = base64.b64encode(fig.png).decode("ascii")
    return (f'<figure><h3>{title}</h3><img id="{fig.id}" alt="{title}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(fig.caption)}</figcaption></figure>")


def render(title: str, meta: str, summary: dict[str, Any], sections: list[tuple[str, list[ReportFigure]]],
           notes: list[str]) -> str:
    """The whole document. sections: (heading, figures); notes: lines about the inputs."""
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary_rows(summary))
    body = [f"<h1>{html.escape(title)}</h1>", f'<p class="meta">{html.escape(meta)}</p>',
            f'<table class="summary" id="summary">{rows}</table>']
    body += [f'<p class="note">{html.escape(n)}</p>' for n in notes]
    for heading, figs in sections:
        body.append(f"<h2>{html.escape(heading)}</h2>")
        body += [_figure(f) for f in figs]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")
