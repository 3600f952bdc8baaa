"""Read one flight-recorder window (a Kineto trace and its shapes file) into its summary, with the
same kernel analysis as captures: categories, phases and gaps (infersight.kernels), and a roofline
of the window's steps when the shapes file models them.

A trace with GPU activity is read as kernels; one without (the CPU engine, a CPU vLLM) as CPU ops
(kernels.cpu_trace). The roofline compares against `gpu_ceilings` or `cpu_ceilings` accordingly;
the CPU default is a nominal figure, to be set for the host (--recorder-peak-tflops / -gbps).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from infersight.correlate.kernel_windows import WindowSummary, summarize_window
from infersight.kernels.categories import classify
from infersight.kernels.cpu_trace import has_device_activity, parse_cpu_ops
from infersight.kernels.frames import KernelTrace, empty_frame
from infersight.kernels.kineto import parse_kineto, read_json_document
from infersight.kernels.roofline import ROOFLINE_COLUMNS, DeviceCeilings, roofline_for_steps
from infersight.kernels.shapes import engine_step_ids, load_capture_shapes, shapes_path_for

#: A nominal CPU ceiling (a few cores' FP32 FMA throughput, dual-channel DRAM); set the host's own.
CPU_CEILINGS = DeviceCeilings("CPU (nominal)", peak_tflops=1.0, peak_gbps=50.0)


def load_window_trace(path: str | Path) -> tuple[KernelTrace, str]:
    """(the trace, gpu | cpu). TraceError when it cannot be read."""
    return window_trace(read_json_document(path), path)


def window_trace(doc: Any, path: str | Path) -> tuple[KernelTrace, str]:
    """(the trace of a parsed Kineto document, gpu | cpu): kernels, or CPU ops when it has no GPU activity."""
    if has_device_activity(doc):
        return parse_kineto(doc, str(path)), "gpu"
    return parse_cpu_ops(doc, str(path)), "cpu"


def analyze_window(path: str | Path, first_step: int, gpu_ceilings: DeviceCeilings = DeviceCeilings(),
                   cpu_ceilings: DeviceCeilings = CPU_CEILINGS) -> tuple[WindowSummary, DeviceCeilings]:
    """The window's summary (step ids as the engine numbers them: from the shapes file's first step,
    else first_step) and the ceilings its roofline used. TraceError when the trace cannot be read."""
    trace, kind = load_window_trace(path)
    ceilings = gpu_ceilings if kind == "gpu" else cpu_ceilings
    shapes_file = shapes_path_for(path)
    captured = load_capture_shapes(shapes_file) if shapes_file.is_file() and shapes_file != Path(path) else None
    classified = engine_step_ids(classify(trace.kernels), trace.ranges,
                                 captured.first_step if captured is not None else first_step)
    roofline = empty_frame(ROOFLINE_COLUMNS)
    if captured is not None and not captured.steps.empty:
        roofline = roofline_for_steps(classified, captured.model, captured.steps, captured.dtype_bytes, ceilings)
    return summarize_window(classified, roofline, kind), ceilings
