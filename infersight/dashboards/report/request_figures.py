"""Request-level figures: where each slow request's time went, and latency distributions."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from infersight.correlate.requests import PARTS, inter_token_latencies
from infersight.dashboards.report.figures import PHASE_COLOURS, PHASE_LABELS, ReportFigure, drawn, skipped
from infersight.dashboards.report.inputs import RunData

TOP_REQUESTS = 30


def decomposition(run: RunData, top: int = TOP_REQUESTS) -> ReportFigure:
    """Stacked horizontal bars, slowest request on top; a tick marks each request's TTFT."""
    fig_id, title = "fig-ttft-decomposition", f"Per-request latency decomposition (slowest {top})"
    req = run.requests.dropna(subset=["e2e_s"])
    if req.empty:
        return skipped(fig_id, title, "requests.parquet has no finished requests.")
    rows = req.astype({p: "float64" for p in PARTS}).sort_values("e2e_s", ascending=False, kind="stable").head(top)

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        y = np.arange(len(rows))
        left = np.zeros(len(rows))
        for part in PARTS:
            width = rows[part].fillna(0.0).to_numpy(np.float64)
            ax.barh(y, width, left=left, color=PHASE_COLOURS[part], label=PHASE_LABELS[part], height=0.8)
            left += width
        ttft = rows["ttft_s"].astype("float64").to_numpy()
        ax.scatter(ttft, y, marker="|", s=120, color="black", label="TTFT", zorder=3)
        ax.set_yticks(y, [f"#{int(r.request_id)} {r.task}" for r in rows.itertuples(index=False)], fontsize=7)
        ax.invert_yaxis()  # slowest first, at the top
        ax.set_xlabel("seconds")
        ax.legend(loc="lower right", fontsize=8, ncols=3)
        ax.grid(axis="x", alpha=0.3)

    caption = (f"The {len(rows)} slowest of {len(req)} requests by end-to-end latency. Bars are queue, prefill, "
               "preemption stall, decode and network time, which sum to e2e; the black tick is the time to first "
               "token (queue + prefill + stalls before it).")
    return drawn(fig_id, title, caption, draw, height=max(3.5, 0.22 * len(rows) + 1.2))


def _cdf(ax: Axes, values: np.ndarray, label: str) -> None:
    v = np.sort(values[np.isfinite(values)])
    if len(v) == 0:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(label)
        return
    ax.step(v * 1e3, np.arange(1, len(v) + 1) / len(v), where="post", color="#1f77b4")
    for q, style in ((0.5, "--"), (0.99, ":")):
        x = float(np.quantile(v, q)) * 1e3
        ax.axvline(x, color="#d62728", linestyle=style, linewidth=1, label=f"p{int(q * 100)} {x:.1f} ms")
    ax.set_title(label)
    ax.set_xlabel("ms")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def latency_cdfs(run: RunData) -> ReportFigure:
    """CDFs of TTFT and e2e per request, and of inter-token latency per token."""
    fig_id, title = "fig-latency-cdf", "Latency distributions"
    if run.requests.empty:
        return skipped(fig_id, title, "requests.parquet has no requests.")
    itl = inter_token_latencies(run.events.request_events)["itl_s"].to_numpy(np.float64)
    itl_label = "inter-token latency (per token)"
    if len(itl) == 0:  # no TOKENS events recorded: fall back to each request's mean gap
        itl = pd.to_numeric(run.requests["itl_mean_s"], errors="coerce").to_numpy(np.float64)
        itl_label = "inter-token latency (request means)"

    def draw(fig: Figure) -> None:
        axes = fig.subplots(1, 3, sharey=True)
        _cdf(axes[0], pd.to_numeric(run.requests["ttft_s"], errors="coerce").to_numpy(np.float64),
             "time to first token")
        _cdf(axes[1], pd.to_numeric(run.requests["e2e_s"], errors="coerce").to_numpy(np.float64),
             "end-to-end latency")
        _cdf(axes[2], itl, itl_label)
        axes[0].set_ylabel("fraction at or below")

    caption = (f"Empirical CDFs over {len(run.requests)} requests (TTFT, e2e) and {len(itl)} "
               "inter-token gaps; dashed and dotted lines mark p50 and p99.")
    return drawn(fig_id, title, caption, draw, height=3.8)


def figures(run: RunData) -> list[ReportFigure]:
    """This section's figures, in page order (skipped ones carry their note)."""
    return [decomposition(run), latency_cdfs(run)]
