"""`infersight analyze PATH [--format text|json]`: what a GPU capture says about where time goes.

Reads a Kineto trace, an nsys SQLite export or an ncu CSV (infersight.kernels), or Prometheus /
dcgm-exporter text (infersight.gpu.analyze). With a capture's shapes file (--shapes, or the one
beside an infersight capture), or with --model, --batch and --context, it also places GEMM and
attention on the roofline of the device: its ceilings measured by `infersight bench ceilings` (read
from the cache), else its datasheet's, or --peak-tflops / --peak-gbps (labelled given); each named
with its source (kernels.ceilings.ceiling_lookup). For an ncu CSV with DRAM metrics it compares the modelled
bytes with the measured ones.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from infersight.commands.numeric_flags import bounded_float, bounded_int
from infersight.kernels.bounded_run import DEFAULT_TIME_LIMIT_S
from infersight.kernels.readers.input_files import MAX_FILE_BYTES

#: Ranges of the numeric flags: far above any real step, low enough that the roofline's per-sequence
#: lists and products stay small (--batch 99999999999 used to allocate for each sequence).
MAX_FLAG_SEQS = 1 << 20
MAX_FLAG_TOKENS = 1 << 24
MAX_ANALYZE_BYTES = 64 << 30


def _emit(text: str) -> None:
    """print, tolerating a reader that stops early (`infersight analyze ... | head`)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _jsonable(value: Any) -> Any:
    """A JSON default for results from other modules (dataclasses, frames, numpy scalars)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "columns") and callable(getattr(value, "to_dict", None)):  # a DataFrame
        return value.to_dict(orient="records")
    for method in ("as_dict", "to_dict"):
        if callable(getattr(value, method, None)):
            return getattr(value, method)()
    if hasattr(value, "item"):  # a numpy scalar
        return value.item()
    return str(value)


def _exposition(path: Path, fmt: str, max_bytes: int) -> str:
    from infersight.kernels.errors import TraceError
    from infersight.kernels.readers.input_files import read_regular_file

    try:
        text = read_regular_file(path, max_bytes).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: cannot read it as text ({exc})") from None
    try:
        from infersight.gpu.analyze import analyze_exposition, format_exposition_table
    except ImportError as exc:
        raise TraceError(f"{path}: Prometheus / dcgm-exporter text, but the GPU telemetry analysis "
                         f"(infersight.gpu.analyze) is not available in this build ({exc})") from None
    result = analyze_exposition(text)
    if fmt == "json":
        return json.dumps({"source": "prometheus", "path": str(path), "result": result}, default=_jsonable)
    return format_exposition_table(result)


def _roofline_inputs(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    if args.model is None:
        return None, []
    if args.batch is None or args.context is None:
        raise ValueError("--model needs --batch (sequences per step) and --context (tokens of context)")
    from infersight.kernels.analysis.roofline import StepShape
    from infersight.runtime.model.model_config import resolve_model

    dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}[args.dtype]
    prompt = args.prompt_len or args.context
    return resolve_model(args.model), [
        StepShape("decode", args.batch, args.query_len, args.context, dtype_bytes),
        StepShape("prefill", args.batch, prompt, prompt, dtype_bytes)]


def _captured(args: argparse.Namespace, path: Path) -> Any:
    """The shapes file given with --shapes, or the one an infersight capture left beside the trace."""
    from infersight.kernels.readers.shapes import load_capture_shapes, shapes_path_for

    if args.shapes:
        return load_capture_shapes(args.shapes)
    beside = shapes_path_for(path)
    return load_capture_shapes(beside) if beside != path and beside.is_file() else None


def report_text(args: argparse.Namespace, model: Any = None, shapes: list[Any] | None = None) -> str:
    """The analysis of one file as the text to print, unbounded: _analyze runs it in a bounded child.
    args: the parsed `analyze` flags; model and shapes: _roofline_inputs(args)."""
    path = Path(args.path)
    from infersight.kernels.readers.load import detect_kind, load_trace, malformed_as_trace_error
    from infersight.kernels.ceilings.ceiling_lookup import CeilingQuery
    from infersight.kernels.analysis.report import build_report, render_text

    kind = detect_kind(path, args.max_bytes)
    if kind == "prometheus":
        return _exposition(path, args.format, args.max_bytes)
    ceilings = CeilingQuery(args.device_name, args.dtype if args.model else None, args.peak_tflops, args.peak_gbps,
                            Path(args.ceilings_cache) if args.ceilings_cache else None)
    if kind == "kineto":  # read once; a CPU-only trace (a vLLM CPU worker's) gets the CPU-op report
        from infersight.kernels.analysis.cpu_trace import cpu_report, has_device_activity, parse_cpu_ops
        from infersight.kernels.readers.kineto import parse_kineto, read_json_document

        doc = read_json_document(path, args.max_bytes)
        with malformed_as_trace_error(path, kind):
            if not has_device_activity(doc):
                report = cpu_report(parse_cpu_ops(doc, str(path)), top=args.top)
                return json.dumps(report) if args.format == "json" else render_text(report)
            trace = parse_kineto(doc, str(path))
    else:
        trace = load_trace(path, kind, args.max_bytes)
    with malformed_as_trace_error(path, kind):
        report = build_report(trace, model, shapes or [], ceilings, top=args.top, captured=_captured(args, path))
        return json.dumps(report) if args.format == "json" else render_text(report)


def _analyze(args: argparse.Namespace) -> int:
    """Checks the path before anything opens it (a FIFO or a device would block the reader), then
    analyses it in a child bounded by --time-limit and the machine's memory (kernels.bounded_run):
    any bad file ends as one TraceError line (exit 2), never a traceback or a hang."""
    from infersight.kernels.bounded_run import RunLimits, default_memory_bytes, run_bounded
    from infersight.kernels.errors import TraceError
    from infersight.kernels.readers.input_files import check_regular_file

    path = Path(args.path)
    check_regular_file(path, args.max_bytes)
    if args.shapes:
        check_regular_file(args.shapes, args.max_bytes)
    model, shapes = _roofline_inputs(args)  # flag errors before any work starts
    limits = RunLimits(args.time_limit or None, default_memory_bytes())
    try:
        text = run_bounded(lambda: report_text(args, model, shapes), limits, str(path))
    except TraceError as exc:
        raise TraceError(" ".join(str(exc).split())) from None  # one line, whatever a library wrote
    _emit(text)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="where GPU time goes in a Kineto / nsys / ncu capture (or GPU metrics text)")
    p.add_argument("path", help="Kineto .json/.json.gz, nsys .sqlite, ncu .csv/.log, or Prometheus text")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--top", type=bounded_int(0, 100_000), default=10, help="how many kernels to list")
    p.add_argument("--time-limit", type=bounded_float(0, 86_400), default=DEFAULT_TIME_LIMIT_S, metavar="S",
                   help=f"give up on the file after S seconds, exit 2 (default {DEFAULT_TIME_LIMIT_S:g}; 0: no limit)")
    p.add_argument("--max-bytes", type=bounded_int(1, MAX_ANALYZE_BYTES), default=MAX_FILE_BYTES, metavar="N",
                   help=f"refuse files larger than N bytes, and gzip that inflates past 2N (default {MAX_FILE_BYTES})")
    roof = p.add_argument_group("roofline (optional)")
    roof.add_argument("--shapes", help="an infersight capture's shapes file (capture-*.shapes.json): model every "
                      "captured step as it ran; found by itself beside an infersight Kineto capture")
    roof.add_argument("--model", help="model shape, e.g. tiny-moe, llama-1b-shape (infersight.runtime.config)")
    roof.add_argument("--batch", type=bounded_int(1, MAX_FLAG_SEQS), help="sequences per step")
    roof.add_argument("--context", type=bounded_int(1, MAX_FLAG_TOKENS), help="tokens of KV context per sequence in decode")
    roof.add_argument("--query-len", type=bounded_int(1, MAX_FLAG_TOKENS), default=1,
                      help="new tokens per sequence per decode step")
    roof.add_argument("--prompt-len", type=bounded_int(1, MAX_FLAG_TOKENS),
                      help="prompt tokens per sequence in prefill (default: --context)")
    roof.add_argument("--dtype", choices=("float32", "float16", "bfloat16", "fp8"), default="bfloat16")
    roof.add_argument("--device-name", help="device whose ceilings to use (default: the capture's own)")
    roof.add_argument("--peak-tflops", type=bounded_float(0, 1e6, low_open=True),
                      help="peak TFLOP/s, labelled given (default: the device's, measured by `infersight bench "
                      "ceilings`, else its datasheet's, else none)")
    roof.add_argument("--peak-gbps", type=bounded_float(0, 1e6, low_open=True),
                      help="peak GB/s, labelled given (default: as --peak-tflops, from a device copy)")
    roof.add_argument("--ceilings-cache", metavar="PATH",
                      help="the measured ceilings to read (default: $INFERSIGHT_CEILINGS, else "
                      "$XDG_CACHE_HOME/infersight/ceilings.json)")
    p.set_defaults(func=_analyze)

