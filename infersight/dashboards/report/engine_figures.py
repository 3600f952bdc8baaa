"""Engine-level figures: MoE expert load and its drift, KV block lifecycle, shared prefixes, and
speculative acceptance. Each is drawn from the correlate analyses over the run's event streams."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from infersight.correlate import kv, moe, prefix, spec_speedup, speculation
from infersight.dashboards.report.figures import ReportFigure, drawn, skipped
from infersight.dashboards.report.inputs import RunData

#: Step windows for the imbalance-over-time figure (fewer when the run has fewer steps).
IMBALANCE_WINDOWS = 16
TOP_GROUPS = 15


def _annotate(ax: Axes, matrix: np.ndarray, fmt: str, top: float | None = None, dark_high: bool = True,
              limit: int = 400) -> None:
    """Write each cell's value on a heatmap small enough to read them, in white on dark cells
    (the high end of a sequential map like Oranges, the low end of viridis)."""
    if matrix.size > limit:
        return
    if top is None:
        top = float(np.nanmax(matrix)) if np.isfinite(matrix).any() else 0.0
    for (i, j), v in np.ndenumerate(matrix):
        if np.isfinite(v):
            dark = v > 0.6 * top if dark_high else v < 0.5 * top
            ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=7, color="white" if dark else "black")


def expert_load(run: RunData) -> ReportFigure:
    """Tokens per (layer, expert) over the whole run, as a heatmap."""
    fig_id, title = "fig-expert-load", "MoE expert load (layer x expert)"
    load = moe.expert_load(run.events.moe)
    if load.empty:
        return skipped(fig_id, title, "No MoE routing events (a dense model, or the moe stream is missing).")
    matrix = load.pivot(index="layer", columns="expert", values="tokens").fillna(0).to_numpy(np.float64)

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        im = ax.imshow(matrix, aspect="auto", cmap="Oranges", interpolation="nearest")
        _annotate(ax, matrix, ".0f")
        ax.set_xlabel("expert")
        ax.set_ylabel("layer")
        ax.set_xticks(range(matrix.shape[1]))
        ax.set_yticks(range(matrix.shape[0]))
        fig.colorbar(im, ax=ax, label="tokens routed")

    return drawn(fig_id, title, "Tokens routed to each expert over the whole run (each token counts once per "
                 "chosen expert).", draw, height=max(3.0, 0.5 * matrix.shape[0] + 1.5))


def expert_imbalance(run: RunData) -> ReportFigure:
    """Per-layer max/mean expert load in consecutive windows of steps."""
    fig_id, title = "fig-expert-imbalance", "MoE imbalance over time (max / mean expert load per window)"
    frame = run.events.moe
    if frame.empty:
        return skipped(fig_id, title, "No MoE routing events.")
    steps = np.sort(frame["step_id"].unique())
    windows = np.array_split(steps, min(IMBALANCE_WINDOWS, len(steps)))
    rows = []
    for w in windows:
        imb = moe.layer_imbalance(frame[frame["step_id"].isin(w)])
        for r in imb.itertuples(index=False):
            rows.append((float(w.mean()), int(r.layer), float(r.max_over_mean)))
    series = pd.DataFrame(rows, columns=["step", "layer", "max_over_mean"])

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        for layer, grp in series.groupby("layer"):
            ax.plot(grp["step"], grp["max_over_mean"], marker="o", markersize=3, label=f"layer {layer}")
        ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
        ax.set_xlabel("engine step (window centre)")
        ax.set_ylabel("max / mean")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncols=4)

    return drawn(fig_id, title, f"{len(windows)} windows of about {len(steps) // len(windows)} steps; 1.0 is a "
                 "perfectly even load, higher means one expert does more than its share.", draw, height=3.8)


def kv_lifecycle(run: RunData) -> ReportFigure:
    """KVBlockEvent counts beside the device pool's in-use / cached / free split per step."""
    fig_id, title = "fig-kv-transitions", "KV block lifecycle: transitions and pool state"
    events, steps = run.events.kv_events, run.events.steps
    if events.empty:
        return skipped(fig_id, title, "No KV block events.")
    counts = kv.transition_counts(events)

    def draw(fig: Figure) -> None:
        left, right = fig.subplots(1, 2, width_ratios=[1, 1.4])
        names = list(counts)
        bars = left.barh(names, [counts[n] for n in names], color="#1f77b4")
        left.bar_label(bars, fontsize=7, padding=2)
        left.invert_yaxis()
        left.set_xlabel("events")
        left.set_title("transitions", fontsize=10)
        if steps.empty:
            right.text(0.5, 0.5, "no step records", ha="center", va="center", transform=right.transAxes)
            return
        s = steps.sort_values("step_id")
        free = s["kv_blocks_total"] - s["kv_blocks_in_use"] - s["kv_blocks_cached"]
        right.stackplot(s["step_id"], s["kv_blocks_in_use"], s["kv_blocks_cached"], free,
                        labels=["in use", "cached", "free"], colors=["#d62728", "#ff7f0e", "#c7e9c0"])
        right.set_xlabel("engine step")
        right.set_ylabel("device blocks")
        right.set_title("pool state after each step", fontsize=10)
        right.legend(fontsize=8, loc="upper left")

    return drawn(fig_id, title, "How often each KVBlockEvent happened, and the device pool's split into in-use, "
                 "cached (reusable by prefix hits) and free blocks.", draw, height=4.0)


def kv_lifetimes(run: RunData) -> ReportFigure:
    """Histograms of block lifetimes, idle time before eviction, and reuse gaps."""
    fig_id, title = "fig-kv-lifetimes", "KV block ages"
    ages = kv.block_lifetimes(run.events.kv_events)
    if ages.empty:
        return skipped(fig_id, title, "No completed KV block intervals.")
    kinds = [k for k in ("lifetime", "idle_before_evict", "reuse_gap") if k in set(ages["kind"])]

    def draw(fig: Figure) -> None:
        axes = np.atleast_1d(fig.subplots(1, len(kinds), squeeze=False)[0])
        for ax, kind in zip(axes, kinds):
            v = ages.loc[ages["kind"] == kind, "seconds"].to_numpy(np.float64)
            v = v[v > 0]
            if len(v):
                bins = np.geomspace(max(v.min(), 1e-6), max(v.max(), 2e-6), 30)
                ax.hist(v, bins=bins, color="#9467bd")
                ax.set_xscale("log")
            ax.set_title(f"{kind} (n={len(v)})", fontsize=10)
            ax.set_xlabel("seconds")
        axes[0].set_ylabel("blocks")

    return drawn(fig_id, title, "lifetime: content filled to dropped; idle_before_evict: cached to evicted; "
                 "reuse_gap: cached to the next prefix hit. Log-spaced bins.", draw, height=3.6)


def prefix_groups(run: RunData) -> ReportFigure:
    """The largest shared-prefix groups and how much of their prompts the cache served."""
    fig_id, title = "fig-prefix-groups", "Shared-prefix groups"
    groups = prefix.top_prefix_groups(run.events.prefix, TOP_GROUPS)
    if groups.empty:
        return skipped(fig_id, title, "No request shares a first prompt block with another.")
    rates = prefix.prefix_hit_rates(run.events.prefix)

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        labels = [f"{int(h):016x}"[:8] for h in groups["group_hash"]]
        bars = ax.barh(labels, groups["requests"], color="#17becf")
        ax.bar_label(bars, [f"{r:.0%} cached" for r in groups["hit_rate"]], fontsize=7, padding=2)
        ax.invert_yaxis()
        ax.set_xlabel("requests")
        ax.set_ylabel("prefix group (hash)")
        ax.margins(x=0.2)

    caption = (f"Requests grouped by their first full prompt block (e.g. a shared system prompt), the largest "
               f"{len(groups)} groups, labelled with the share of the group's prompt tokens served from the cache. "
               f"Overall: {rates['token_hit_rate']:.1%} of prompt tokens, {rates['request_hit_rate']:.1%} of requests.")
    return drawn(fig_id, title, caption, draw, height=max(3.0, 0.3 * len(groups) + 1.2))


def acceptance(run: RunData) -> list[ReportFigure]:
    """Acceptance by task x draft position, and the predicted speedup per task."""
    ids = ("fig-acceptance-position", "fig-spec-speedup")
    titles = ("Speculative acceptance by task and draft position", "Predicted speculation speedup by task")
    spec = run.events.spec
    if spec.empty:
        return [skipped(i, t, "No speculative verifications (speculation off).") for i, t in zip(ids, titles)]
    by_pos = speculation.acceptance_by_position(spec)
    # The model-error term the agent used (by its engine's device), from the run's summary; else the CPU's.
    used = {t.get("model_error") for t in run.summary.get("spec", {}).get("by_task", {}).values()} - {None}
    by_task = spec_speedup.speedup_by_task(spec, run.events.step_timing,
                                           used.pop() if len(used) == 1 else spec_speedup.MODEL_ERROR)
    matrix = by_pos.pivot(index="task", columns="position", values="accept_rate")

    def draw_positions(fig: Figure) -> None:
        ax = fig.add_subplot()
        im = ax.imshow(matrix.to_numpy(np.float64), aspect="auto", cmap="viridis", vmin=0, vmax=1)
        _annotate(ax, matrix.to_numpy(np.float64), ".2f", top=1.0, dark_high=False)
        ax.set_xticks(range(matrix.shape[1]), [str(c) for c in matrix.columns])
        ax.set_yticks(range(matrix.shape[0]), list(matrix.index))
        ax.set_xlabel("draft position")
        fig.colorbar(im, ax=ax, label="accepted / proposed")

    def draw_speedup(fig: Figure) -> None:
        ax = fig.add_subplot()
        s = by_task["predicted_speedup"].to_numpy(np.float64)
        shown = np.nan_to_num(s, nan=0.0)  # not measured: no bar, labelled below
        bars = ax.bar(by_task["task"].astype(str), shown, color=np.where(shown >= 1.0, "#2ca02c", "#d62728"))
        ax.bar_label(bars, [f"{v:.2f}x\nα={a:.2f}" if np.isfinite(v) else f"not measured\nα={a:.2f}"
                            for v, a in zip(s, by_task["accept_rate"])], fontsize=7)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_ylabel("predicted speedup")
        ax.margins(y=0.25)

    return [
        drawn(ids[0], titles[0], "Share of drafts accepted at each position of the window, per task; a draft is "
              "checked only when every earlier one was accepted, so rates fall with position.", draw_positions,
              height=max(2.8, 0.5 * matrix.shape[0] + 1.4)),
        drawn(ids[1], titles[1], "Decode speedup per task from measured step times: tokens per speculative step "
              "over its time, against one token per plain probe step over its time at the same batch size "
              "(engine run with spec_probe_every); below 1 (red) speculation costs more than it saves.",
              draw_speedup, height=3.4),
    ]


def figures(run: RunData) -> list[ReportFigure]:
    """This section's figures, in page order (skipped ones carry their note)."""
    return [expert_load(run), expert_imbalance(run), kv_lifecycle(run), kv_lifetimes(run), prefix_groups(run),
            *acceptance(run)]
