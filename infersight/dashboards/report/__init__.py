"""`infersight report`: one self-contained HTML file (OUT_DIR/report.html) from a run's output.

What it reads is documented in `inputs.py`; the figures are drawn with matplotlib (Agg) from the
`infersight.correlate` analyses and embedded as PNG, so the file needs nothing else to open.
Bad input (no directory, a required file missing or unreadable) raises ValueError with a message
saying what is missing; the CLI turns it into exit code 2.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path

from infersight.dashboards.report import engine_figures, gpu_figures, kernel_figures, request_figures
from infersight.dashboards.report.inputs import RunData, load_run
from infersight.dashboards.report.page import render

REPORT_NAME = "report.html"


def build_html(run: RunData) -> str:
    """The report for a loaded run, as an HTML string."""
    sections = [
        ("Requests", request_figures.figures(run)),
        ("Engine internals", engine_figures.figures(run)),
        ("GPU", gpu_figures.figures(run)),
        ("Kernels", kernel_figures.figures(run)),
    ]
    notes = []
    if run.missing_streams:
        notes.append("Event streams without a file (read as empty): " + ", ".join(run.missing_streams) + ".")
    for d in run.summary.get("auto_apply", {}).get("decisions", []):  # the agent's closed loop (--auto-apply)
        notes.append(f"Closed loop, change {d['change_id']} ({d['knob']} of {d['target']}, {d['before']} -> "
                     f"{d['after']}): {d['stage']}: {d['reason']}")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    meta = f"{run.out_dir.resolve()} - {len(run.requests)} requests, {len(run.events.steps)} steps - generated {stamp}"
    return render("infersight report", meta, run.summary, sections, notes)


def write_report(out_dir: str | Path) -> Path:
    """Write OUT_DIR/report.html and return its path."""
    run = load_run(out_dir)
    path = run.out_dir / REPORT_NAME
    path.write_text(build_html(run), encoding="utf-8")
    return path
