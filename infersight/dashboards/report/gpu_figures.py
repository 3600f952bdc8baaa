"""GPU activity over the run, on the engine's clock, above the steps it ran (skipped with a note
when the run has no GPU samples file, e.g. a CPU run)."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from infersight.dashboards.report.figures import ReportFigure, drawn, skipped
from infersight.dashboards.report.inputs import GPU_SAMPLE_FILES, RunData


def _is_activity(field: str) -> bool:
    """Activity fields are the 0..1 ratios (engine, SM, tensor, DRAM activity, utilisation)."""
    try:
        from infersight.gpu.fields import unit_of
    except ImportError:  # the GPU package is optional to the report; fall back to the naming rule
        return field.endswith("_ratio")
    return unit_of(field) == "ratio" or field.endswith("_ratio")


def gpu_activity(run: RunData) -> ReportFigure:
    """Activity fields over time, above the steps (bars spanning each step, tokens fed)."""
    fig_id, title = "fig-gpu-activity", "GPU activity aligned with engine steps"
    samples = run.gpu_samples
    if samples is None:
        return skipped(fig_id, title, f"No GPU samples file ({' or '.join(GPU_SAMPLE_FILES)}): this run had no "
                                      "GPU telemetry (a CPU run, or no sampler attached).")
    if "instance" in samples.columns:  # a MIG instance's activity is a share of its slice, not of the GPU
        samples = samples[samples["instance"].fillna("") == ""]
    activity = samples[[_is_activity(str(f)) for f in samples["field"]]]
    if activity.empty:
        return skipped(fig_id, title, f"{run.gpu_samples_path} holds no activity (ratio) fields.")
    steps = run.events.steps.sort_values("start_ns")
    t0 = int(steps["start_ns"].min()) if not steps.empty else int(activity["ts_ns"].min())
    # Mean over GPUs per (field, poll): one line per field keeps the figure readable on 8 GPUs.
    lines = (activity.assign(t=(activity["ts_ns"] - t0) / 1e9)
             .groupby(["field", "t"], as_index=False)["value"].mean())

    def draw(fig: Figure) -> None:
        top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
        for field, grp in lines.groupby("field"):
            top.plot(grp["t"], grp["value"], label=str(field), linewidth=1.2)
        top.set_ylabel("activity (0..1)")
        top.set_ylim(0, 1.05)
        top.grid(alpha=0.3)
        top.legend(fontsize=7, ncols=3, loc="upper right")
        if steps.empty:
            bottom.text(0.5, 0.5, "no step records", ha="center", va="center", transform=bottom.transAxes)
        else:
            start = (steps["start_ns"].to_numpy(np.int64) - t0) / 1e9
            dur = (steps["end_ns"] - steps["start_ns"]).to_numpy(np.int64) / 1e9
            prefill = steps["prefill_tokens"].to_numpy(np.float64)
            decode = (steps["decode_tokens"] + steps["spec_tokens"]).to_numpy(np.float64)
            bottom.bar(start, prefill, width=dur, align="edge", color="#1f77b4", label="prefill tokens")
            bottom.bar(start, decode, width=dur, bottom=prefill, align="edge", color="#2ca02c",
                       label="decode + spec tokens")
            bottom.legend(fontsize=7, loc="upper right")
        bottom.set_ylabel("tokens / step")
        bottom.set_xlabel("seconds since the first step")

    n_gpus = activity["gpu"].nunique()
    caption = (f"Activity fields from {run.gpu_samples_path.name if run.gpu_samples_path else 'the samples'} "
               f"(mean over {n_gpus} GPU{'s' if n_gpus != 1 else ''}), and below, each engine step as a bar "
               "spanning its duration, as tall as the tokens it fed. Both on the engine's monotonic clock."
               + _phase_text(run))
    return drawn(fig_id, title, caption, draw, height=5.0)


def _phase_text(run: RunData) -> str:
    """Mean tensor / DRAM activity of prefill-heavy vs decode-heavy steps (infersight.gpu.frames)."""
    if run.gpu_samples is None or run.events.steps.empty:
        return ""
    try:
        from infersight.gpu.frames import phase_breakdown
    except ImportError:  # optional: the figure stands without it
        return ""
    table = phase_breakdown(run.gpu_samples, run.events.steps)
    if table.empty:
        return ""
    parts = [f"{r.phase.replace('_', '-')} {r.field} {r.mean:.2f}" for r in table.itertuples(index=False)]
    return " Mean activity inside steps: " + "; ".join(parts) + "."


def figures(run: RunData) -> list[ReportFigure]:
    """This section's figures, in page order (skipped ones carry their note)."""
    return [gpu_activity(run)]
