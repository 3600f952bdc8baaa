"""Read one flight-recorder window (a Kineto trace and its shapes file) into its summary, with the
same kernel analysis as captures: categories, phases and gaps (infersight.kernels), and a roofline
of the window's steps when the shapes file models them.

A trace with GPU activity is read as kernels; one without (the CPU engine, a CPU vLLM) as CPU ops
(kernels.analysis.cpu_trace). The roofline's ceilings are looked up for the device that ran the window (the
trace's GPU; for CPU ops, this host's CPU) at the window's dtype (kernels.ceilings.ceiling_lookup): given
(--recorder-peak-tflops / -gbps), else measured by `infersight bench ceilings`, else the datasheet's,
else none (the window's roofline rows then carry achieved rates only, with no share of a roof).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from infersight.correlate.kernel_windows import WindowSummary, summarize_window
from infersight.kernels.analysis.categories import classify
from infersight.kernels.ceilings.ceiling_cache import host_cpu_name
from infersight.kernels.ceilings.ceiling_lookup import CeilingLookup, CeilingQuery
from infersight.kernels.ceilings.device_ceilings import dtype_name_for_bytes
from infersight.kernels.analysis.cpu_trace import has_device_activity, parse_cpu_ops
from infersight.kernels.frames import KernelTrace, empty_frame
from infersight.kernels.readers.kineto import parse_kineto, read_json_document
from infersight.kernels.analysis.roofline import ROOFLINE_COLUMNS, roofline_for_steps
from infersight.kernels.readers.shapes import engine_step_ids, load_capture_shapes, shapes_path_for


def load_window_trace(path: str | Path) -> tuple[KernelTrace, str]:
    """(the trace, gpu | cpu). TraceError when it cannot be read."""
    return window_trace(read_json_document(path), path)


def window_trace(doc: Any, path: str | Path) -> tuple[KernelTrace, str]:
    """(the trace of a parsed Kineto document, gpu | cpu): kernels, or CPU ops when it has no GPU activity."""
    if has_device_activity(doc):
        return parse_kineto(doc, str(path)), "gpu"
    return parse_cpu_ops(doc, str(path)), "cpu"


def window_ceilings(query: CeilingQuery, trace: KernelTrace, kind: str, dtype_bytes: int) -> CeilingLookup:
    """The ceilings of the device that ran a window of `kind` (gpu: the trace's; cpu: this host's)."""
    return query.lookup(trace.devices if kind == "gpu" else [host_cpu_name()], dtype_name_for_bytes(dtype_bytes))


def analyze_window(path: str | Path, first_step: int, ceilings: CeilingQuery = CeilingQuery()
                   ) -> tuple[WindowSummary, CeilingLookup | None]:
    """The window's summary (step ids as the engine numbers them: from the shapes file's first step,
    else first_step) and the ceilings lookup of its roofline (None: no roofline, the window's shapes
    are unknown). TraceError when the trace cannot be read."""
    trace, kind = load_window_trace(path)
    shapes_file = shapes_path_for(path)
    captured = load_capture_shapes(shapes_file) if shapes_file.is_file() and shapes_file != Path(path) else None
    classified = engine_step_ids(classify(trace.kernels), trace.ranges,
                                 captured.first_step if captured is not None else first_step)
    roofline, lookup = empty_frame(ROOFLINE_COLUMNS), None
    if captured is not None and not captured.steps.empty:
        lookup = window_ceilings(ceilings, trace, kind, captured.dtype_bytes)
        roofline = roofline_for_steps(classified, captured.model, captured.steps, captured.dtype_bytes,
                                      lookup.ceilings)
    return summarize_window(classified, roofline, kind), lookup
