"""`infersight analyze PATH [--format text|json]`: what a GPU capture says about where time goes.

Reads a Kineto trace, an nsys SQLite export or an ncu CSV (infersight.kernels), or Prometheus /
dcgm-exporter text (infersight.gpu.analyze). With a capture's shapes file (--shapes, or the one
beside an infersight capture), or with --model, --batch and --context, it also places GEMM and
attention on the roofline of the device (--peak-tflops / --peak-gbps); for an ncu CSV with DRAM
metrics it compares the modelled bytes with the measured ones.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any


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


def _exposition(path: Path, fmt: str) -> int:
    from infersight.kernels.frames import TraceError

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read it as text ({exc})") from None
    try:
        from infersight.gpu.analyze import analyze_exposition, format_exposition_table
    except ImportError as exc:
        raise TraceError(f"{path}: Prometheus / dcgm-exporter text, but the GPU telemetry analysis "
                         f"(infersight.gpu.analyze) is not available in this build ({exc})") from None
    result = analyze_exposition(text)
    if fmt == "json":
        _emit(json.dumps({"source": "prometheus", "path": str(path), "result": result}, default=_jsonable))
    else:
        _emit(format_exposition_table(result))
    return 0


def _roofline_inputs(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    if args.model is None:
        return None, []
    if args.batch is None or args.context is None:
        raise ValueError("--model needs --batch (sequences per step) and --context (tokens of context)")
    from infersight.kernels.roofline import StepShape
    from infersight.runtime.model_config import resolve_model

    dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}[args.dtype]
    prompt = args.prompt_len or args.context
    return resolve_model(args.model), [
        StepShape("decode", args.batch, args.query_len, args.context, dtype_bytes),
        StepShape("prefill", args.batch, prompt, prompt, dtype_bytes)]


def _captured(args: argparse.Namespace, path: Path) -> Any:
    """The shapes file given with --shapes, or the one an infersight capture left beside the trace."""
    from infersight.kernels.shapes import load_capture_shapes, shapes_path_for

    if args.shapes:
        return load_capture_shapes(args.shapes)
    beside = shapes_path_for(path)
    return load_capture_shapes(beside) if beside != path and beside.is_file() else None


def _cpu_only(path: Path) -> bool:
    from infersight.kernels.cpu_trace import has_device_activity
    from infersight.kernels.kineto import read_json_document

    return not has_device_activity(read_json_document(path))


def _analyze(args: argparse.Namespace) -> int:
    from infersight.kernels.load import detect_kind, load_trace
    from infersight.kernels.report import build_report, render_text
    from infersight.kernels.roofline import DeviceCeilings

    path = Path(args.path)
    kind = detect_kind(path)
    if kind == "prometheus":
        return _exposition(path, args.format)
    model, shapes = _roofline_inputs(args)
    given = {"name": args.device_name, "peak_tflops": args.peak_tflops, "peak_gbps": args.peak_gbps}
    ceilings = DeviceCeilings(**{k: v for k, v in given.items() if v is not None})
    if kind == "kineto" and _cpu_only(path):  # e.g. a vLLM CPU worker's trace: CPU ops, no kernels
        from infersight.kernels.cpu_trace import cpu_report, parse_cpu_ops
        from infersight.kernels.kineto import read_json_document

        report = cpu_report(parse_cpu_ops(read_json_document(path), str(path)), top=args.top)
    else:
        trace = load_trace(path, kind)
        report = build_report(trace, model, shapes, ceilings, top=args.top, captured=_captured(args, path))
    _emit(json.dumps(report) if args.format == "json" else render_text(report))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="where GPU time goes in a Kineto / nsys / ncu capture (or GPU metrics text)")
    p.add_argument("path", help="Kineto .json/.json.gz, nsys .sqlite, ncu .csv/.log, or Prometheus text")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--top", type=int, default=10, help="how many kernels to list")
    roof = p.add_argument_group("roofline (optional)")
    roof.add_argument("--shapes", help="an infersight capture's shapes file (capture-*.shapes.json): model every "
                      "captured step as it ran; found by itself beside an infersight Kineto capture")
    roof.add_argument("--model", help="model shape, e.g. tiny-moe, llama-1b-shape (infersight.runtime.config)")
    roof.add_argument("--batch", type=int, help="sequences per step")
    roof.add_argument("--context", type=int, help="tokens of KV context per sequence in decode")
    roof.add_argument("--query-len", type=int, default=1, help="new tokens per sequence per decode step")
    roof.add_argument("--prompt-len", type=int, help="prompt tokens per sequence in prefill (default: --context)")
    roof.add_argument("--dtype", choices=("float32", "float16", "bfloat16", "fp8"), default="bfloat16")
    roof.add_argument("--device-name", help="device the ceilings belong to (default: NVIDIA H200)")
    roof.add_argument("--peak-tflops", type=float, help="peak TFLOP/s (default: 782, bf16 GEMM on our H200)")
    roof.add_argument("--peak-gbps", type=float, help="peak GB/s (default: 4270, device copy on our H200)")
    p.set_defaults(func=_analyze)

