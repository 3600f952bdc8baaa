"""A report figure: a matplotlib drawing rendered to PNG bytes, or a note saying why it is absent.

Figures are drawn on `matplotlib.figure.Figure` objects with an explicit Agg canvas, never
through pyplot: pyplot keeps global state (open figures, the current backend) that a library
must not touch, and Agg needs no display.
"""
from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: One colour per request phase, shared by every figure that shows phases.
PHASE_COLOURS = {"queue_s": "#9e9e9e", "prefill_s": "#1f77b4", "preemption_stall_s": "#d62728",
                 "decode_s": "#2ca02c", "network_s": "#ff7f0e"}
PHASE_LABELS = {"queue_s": "queue", "prefill_s": "prefill", "preemption_stall_s": "preemption stall",
                "decode_s": "decode", "network_s": "network"}
DPI = 100


@dataclass(frozen=True)
class ReportFigure:
    """id: the HTML element id (img#id, or p#note-<id> when skipped); png: None when skipped,
    with `note` saying why."""

    id: str
    title: str
    caption: str = ""
    png: bytes | None = None
    note: str = ""


def new_figure(width: float = 10.0, height: float = 4.5) -> Figure:
    """A figure (inches) with its own Agg canvas, laid out so labels are never clipped."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def to_png(fig: Figure) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def drawn(fig_id: str, title: str, caption: str, draw: Callable[[Figure], None],
          width: float = 10.0, height: float = 4.5) -> ReportFigure:
    """Draw on a new figure and keep its PNG."""
    fig = new_figure(width, height)
    draw(fig)
    return ReportFigure(fig_id, title, caption, to_png(fig))


def skipped(fig_id: str, title: str, note: str) -> ReportFigure:
    """A figure the run's inputs cannot support, and why."""
    return ReportFigure(fig_id, title, note=note)
