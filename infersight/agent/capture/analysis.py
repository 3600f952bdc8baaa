"""What the agent reads from a finished capture of its own engine: the kernel breakdown and findings
of its trace (the same report `infersight analyze` builds) and each captured request's kernel
summary. Captures through another engine's profiler (sources.vllm.profiler) are analysed there.

The kernel analysis is imported when a capture is analysed, not with the agent: most agents never
take one.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd


def analyze_capture(path: str, batch: "pd.DataFrame", first_step: int,
                    steps: "pd.DataFrame | None" = None) -> tuple[dict[str, object], dict]:
    """A finished capture's kernel breakdown and findings (or why there is none), and each
    captured request's kernel summary (request id -> kernel ns and top categories). steps: the
    engine's STEP records; the steps before the capture tell its own step time (the capture's gaps
    are judged against it: kernels.analysis.step_findings)."""
    from infersight.kernels.analysis.attribution import request_kernel_summaries
    from infersight.kernels.readers.load import load_trace
    from infersight.kernels.analysis.report import build_report
    from infersight.kernels.readers.shapes import load_capture_shapes, shapes_path_for
    from infersight.kernels.analysis.step_findings import outside_step_times

    shapes_file = shapes_path_for(path)
    if Path(path) == shapes_file:  # a cuda-profiler capture: the trace is nsys's or ncu's, not ours
        return {"shapes": str(shapes_file), "note": "no trace of ours: analyse the nsys / ncu output "
                f"with `infersight analyze TRACE --shapes {shapes_file}`"}, {}
    try:
        captured = load_capture_shapes(shapes_file) if shapes_file.is_file() else None
        trace = load_trace(Path(path))
        outside = outside_step_times(steps, first_step) if steps is not None else {}
        report = build_report(trace, captured=captured, outside_step_ns=outside)
    except (ValueError, OSError) as exc:
        return {"error": str(exc)}, {}
    report["shapes"] = str(shapes_file) if captured is not None else None
    per_request = request_kernel_summaries(trace.kernels, batch, first_step)
    report["requests"] = len(per_request)
    return report, per_request
