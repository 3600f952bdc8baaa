"""Kernel-level figures from a profiler capture in the run directory: GPU time by kernel category,
and a roofline scatter (skipped with a note when there is no capture, or it lacks the counters).

Roofline, per kernel from Nsight Compute metrics: FLOPs from the SASS floating-point instruction
counts (add and mul count 1, fma 2; tensor-core work is not in these counters, so GEMMs on tensor
cores sit too low), bytes from DRAM traffic, time from the kernel's duration. Without those
counters, the speed-of-light percentages ncu prints by default (compute and memory throughput,
as fractions of peak) give a simpler scatter of the same question: compute- or memory-bound?
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from infersight.dashboards.report.figures import ReportFigure, drawn, skipped
from infersight.dashboards.report.inputs import CAPTURE_PATTERNS, RunData

_FLOP_METRIC = re.compile(r"^sm__sass_thread_inst_executed_op_[dhf](add|mul|fma)_pred_on\.sum$")
_DRAM_BYTES = ("dram__bytes.sum",)
_DRAM_PARTS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
_SOL_COMPUTE = ("Compute (SM) Throughput", "sm__throughput.avg.pct_of_peak_sustained_elapsed")
_SOL_MEMORY = ("Memory Throughput", "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed")


def _load(path: Path) -> Any:
    """The capture as an infersight.kernels KernelTrace (loaders imported here: optional package)."""
    name = path.name.lower()
    if name.endswith((".json", ".json.gz")):
        from infersight.kernels.readers.kineto import load_kineto
        return load_kineto(path)
    if name.endswith(".sqlite"):
        from infersight.kernels.readers.nsys import load_nsys
        return load_nsys(path)
    from infersight.kernels.readers.ncu import load_ncu
    return load_ncu(path)


def load_captures(run: RunData) -> tuple[list[Any], list[str]]:
    """(traces, problems): every capture that parses, and one line per capture that does not."""
    traces, problems = [], []
    for path in run.captures:
        try:
            traces.append(_load(path))
        except ImportError as exc:
            problems.append(f"{path.name}: the kernel analyses are not installed ({exc})")
        except ValueError as exc:  # TraceError: unreadable, truncated or unknown capture
            problems.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - a capture is optional: one that breaks a parser
            # must cost its figures, never the rest of the report.
            problems.append(f"{path.name}: could not be analysed ({type(exc).__name__}: {exc})")
    return traces, problems


def _no_capture(fig_id: str, title: str, problems: list[str]) -> ReportFigure:
    if problems:
        return skipped(fig_id, title, "No usable profiler capture: " + "; ".join(problems))
    return skipped(fig_id, title, "No profiler capture in this run (looked for "
                                  f"{', '.join(CAPTURE_PATTERNS)}; `infersight capture` makes one).")


def category_breakdown(traces: list[Any], problems: list[str]) -> ReportFigure:
    """GPU time per kernel category, from timeline captures when there are any."""
    fig_id, title = "fig-kernel-categories", "GPU time by kernel category"
    timed = [t for t in traces if not t.kernels.empty and int(t.kernels["dur_ns"].sum()) > 0]
    # A timeline capture (Kineto, nsys) times the real run; ncu replays kernels one by one, so its
    # durations count only when nothing better exists, and never on top of a timeline's.
    timed = [t for t in timed if getattr(t, "has_timeline", True)] or timed
    if not timed:
        return _no_capture(fig_id, title, problems)
    from infersight.kernels.analysis.categories import classify

    kernels = pd.concat([classify(t.kernels) for t in timed], ignore_index=True)
    by_cat = kernels.groupby("op_category")["dur_ns"].sum().sort_values(ascending=False)
    total = float(by_cat.sum())

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        bars = ax.barh(by_cat.index.astype(str), by_cat.to_numpy(np.float64) / 1e6, color="#8c564b")
        ax.bar_label(bars, [f"{v / total:.1%}" for v in by_cat.to_numpy(np.float64)], fontsize=7, padding=2)
        ax.invert_yaxis()
        ax.set_xlabel("GPU time (ms)")
        ax.margins(x=0.15)

    sources = ", ".join(sorted({Path(t.path).name for t in timed}))
    return drawn(fig_id, title, f"{len(kernels)} GPU activities ({total / 1e6:.1f} ms) from {sources}, by the "
                 "category infersight.kernels.analysis.categories assigns from kernel names and enclosing ranges.",
                 draw, height=max(3.0, 0.3 * len(by_cat) + 1.2))


def _per_kernel(metrics: pd.DataFrame, names: tuple[str, ...]) -> pd.Series:
    rows = metrics[metrics["metric"].isin(names) & metrics["value"].notna()]
    return rows.groupby("kernel_id")["value"].sum()


def _duration(metrics: pd.DataFrame) -> pd.Series:
    """Seconds per kernel_id from the most specific duration metric each kernel has."""
    from infersight.kernels.readers.ncu import DURATION_METRICS

    timed = metrics[(metrics["base_unit"] == "second") & metrics["value"].notna()]
    out = pd.Series(dtype="float64")
    for metric in DURATION_METRICS:  # most specific first; later ones only fill gaps
        per_kernel = timed[timed["metric"] == metric].drop_duplicates("kernel_id").set_index("kernel_id")["value"]
        out = out.combine_first(per_kernel) if not out.empty else per_kernel.astype("float64")
    return out


def roofline_points(trace: Any) -> pd.DataFrame:
    """kernel_id, name, flops, bytes, seconds for kernels with all three (may be empty)."""
    m = trace.metrics
    if m.empty:
        return pd.DataFrame(columns=["kernel_id", "name", "flops", "bytes", "seconds"])
    flop_rows = m[m["metric"].map(lambda x: bool(_FLOP_METRIC.match(str(x)))) & m["value"].notna()]
    weight = np.where(flop_rows["metric"].str.contains("fma_pred"), 2.0, 1.0)
    flops = (flop_rows["value"] * weight).groupby(flop_rows["kernel_id"]).sum()
    dram = _per_kernel(m, _DRAM_BYTES)
    if dram.empty:
        dram = _per_kernel(m, _DRAM_PARTS)
    names = m.drop_duplicates("kernel_id").set_index("kernel_id")["name"]
    seconds = _duration(m)
    df = pd.DataFrame({"flops": flops, "bytes": dram, "seconds": seconds}).dropna()
    df = df[(df["flops"] > 0) & (df["bytes"] > 0) & (df["seconds"] > 0)]
    return df.assign(name=names.reindex(df.index)).rename_axis("kernel_id").reset_index()


def sol_points(trace: Any) -> pd.DataFrame:
    """kernel_id, name, compute, memory (fractions of peak) from ncu's speed-of-light section."""
    m = trace.metrics
    if m.empty:
        return pd.DataFrame(columns=["kernel_id", "name", "compute", "memory"])
    ratio = m[m["base_unit"] == "ratio"]
    df = pd.DataFrame({"compute": _per_kernel(ratio, _SOL_COMPUTE), "memory": _per_kernel(ratio, _SOL_MEMORY)}).dropna()
    names = m.drop_duplicates("kernel_id").set_index("kernel_id")["name"]
    return df.assign(name=names.reindex(df.index)).rename_axis("kernel_id").reset_index()


def roofline(traces: list[Any], problems: list[str]) -> ReportFigure:
    """Achieved FLOP/s against arithmetic intensity per kernel, or the speed-of-light scatter."""
    fig_id, title = "fig-roofline", "Roofline"
    with_metrics = [t for t in traces if not t.metrics.empty]
    if not with_metrics:
        if traces:
            return skipped(fig_id, title, "The capture has no per-kernel counters (a timeline capture); a roofline "
                                          "needs an Nsight Compute CSV in captures/.")
        return _no_capture(fig_id, title, problems)
    points = pd.concat([roofline_points(t) for t in with_metrics], ignore_index=True)
    if not points.empty:
        def draw(fig: Figure) -> None:
            ax = fig.add_subplot()
            intensity = points["flops"] / points["bytes"]
            achieved = points["flops"] / points["seconds"]
            size = 20 + 200 * points["seconds"] / points["seconds"].max()
            ax.scatter(intensity, achieved, s=size, alpha=0.7, color="#e377c2", edgecolors="black", linewidths=0.5)
            # The device's peaks are not in the capture; the best observed bandwidth and FLOP/s
            # stand in as roofs, so distance below them still reads as headroom.
            bandwidth, peak = float((achieved / intensity).max()), float(achieved.max())
            xs = np.geomspace(float(intensity.min()) / 2, float(intensity.max()) * 2, 100)
            ax.plot(xs, np.minimum(bandwidth * xs, peak), color="grey", linestyle="--", linewidth=1,
                    label=f"best observed: {bandwidth / 1e9:.0f} GB/s, {peak / 1e12:.2f} TFLOP/s")
            for _, r in points.nlargest(8, "seconds").iterrows():
                ax.annotate(str(r["name"])[:32], (r["flops"] / r["bytes"], r["flops"] / r["seconds"]), fontsize=6,
                            xytext=(4, 4), textcoords="offset points")
            ax.legend(fontsize=8, loc="lower right")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
            ax.set_ylabel("achieved FLOP/s")
            ax.grid(alpha=0.3, which="both")

        return drawn(fig_id, title, f"{len(points)} kernels; point size is duration; the dashed roof is the "
                     "best bandwidth and FLOP/s any kernel achieved (the device peaks are not in the capture). FLOPs count non-tensor "
                     "floating-point instructions (fma = 2), so tensor-core kernels sit low.", draw, height=4.5)
    sol = pd.concat([sol_points(t) for t in with_metrics], ignore_index=True)
    if sol.empty:
        return skipped(fig_id, title, "The Nsight Compute capture has neither FLOP/DRAM counters nor speed-of-light "
                                      "throughputs (collect the SpeedOfLight section).")

    def draw_sol(fig: Figure) -> None:
        ax = fig.add_subplot()
        ax.scatter(sol["memory"], sol["compute"], alpha=0.7, color="#e377c2", edgecolors="black", linewidths=0.5)
        ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1)
        ax.set_xlim(0, 1.05)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("memory throughput (fraction of peak)")
        ax.set_ylabel("compute throughput (fraction of peak)")
        ax.grid(alpha=0.3)

    return drawn(fig_id, title + " (speed of light)", f"{len(sol)} kernels from ncu's speed-of-light section: "
                 "above the diagonal compute-bound, below it memory-bound; near the origin, latency-bound.",
                 draw_sol, height=4.5)


def figures(run: RunData) -> list[ReportFigure]:
    """This section's figures, in page order (skipped ones carry their note)."""
    traces, problems = load_captures(run)
    return [category_breakdown(traces, problems), roofline(traces, problems)]
