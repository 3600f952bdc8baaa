"""PyTorch profiler (Kineto) Chrome-trace JSON -> KernelTrace.

What is read (Chrome trace events, "ph": "X" complete events, categories compared in lower case
so that older traces' "Kernel" / "Memcpy" / "Runtime" spellings work too):
- GPU activity: cat kernel, gpu_memcpy (memcpy), gpu_memset (memset); device and stream from
  args (else pid and tid), args.correlation, args.grid / args.block, args.bytes;
- launches: cat cuda_runtime / cuda_driver (runtime / driver) with args.correlation;
- ranges: user_annotation (record_function / NVTX-backed ranges on a CPU thread) and
  gpu_user_annotation (Kineto's copy of those ranges on a GPU stream);
- "ac2g" flow events: "s" sits on the launch, "f" on the GPU event, both with the correlation id as
  "id"; used only for GPU events whose args lack a correlation.

A kernel's range_path comes from the CPU ranges enclosing its launch, on the launching thread:
that stack is complete, whereas Kineto emits GPU-side copies only for some ranges (outer ones
such as "step" are often missing). GPU-side annotations enclosing the kernel on its stream are
the fallback when the launch or its ranges are absent.

Timestamps are µs with up to 3 decimals. At trace magnitudes (~5e12 µs) a float64 keeps only
~1e-3 µs, so JSON floats are kept as their text and ts / dur are converted to integer ns exactly
(Decimal on the text; parsing every float as Decimal would cost 4x the time of the parse).
"""
from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from infersight.kernels.frames import (
    KERNEL_COLUMNS, RANGE_COLUMNS, RUNTIME_COLUMNS, KernelTrace, TraceError, format_dims, typed_frame,
)
from infersight.kernels.readers.input_files import MAX_FILE_BYTES, gunzip_bounded, read_regular_file
from infersight.kernels.readers.ranges import HELPER_COLUMNS, enclosing_range, nest_ranges

_GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "gpu_memcpy", "memcpy": "gpu_memcpy",
             "gpu_memset": "gpu_memset", "memset": "gpu_memset"}
_LAUNCH_CATS = {"cuda_runtime", "runtime", "cuda_driver", "driver"}
_RANGE_CATS = {"user_annotation": "cpu", "gpu_user_annotation": "gpu"}
_TRAILING_INT = re.compile(r"(-?\d+)\s*$")
_INT64 = (-(2 ** 63), 2 ** 63 - 1)
# Decimal exponents past which a value cannot fit an int64 (in ns): checked before any conversion, as
# int(Decimal("1e999999")) builds a million-digit integer (32 s for a 113-byte file) and
# Decimal("1e999999") * 1000 overflows the decimal context.
_MAX_ADJUSTED = 19


def _int64(value: int) -> int | None:
    """value when it fits an int64 column, else None (a garbled number, not a timestamp)."""
    return value if _INT64[0] <= value <= _INT64[1] else None


def read_json_document(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The parsed JSON of a .json or gzipped file (by content, not by name); JSON floats are
    returned as their text (see the module docstring). A regular file of at most `max_bytes`
    (gzip: inflating to at most twice that); TraceError for anything unreadable."""
    p = Path(path)
    raw = read_regular_file(p, max_bytes)
    if raw[:2] == b"\x1f\x8b":
        raw = gunzip_bounded(raw, p, 2 * max_bytes)
    if not raw.strip():
        raise TraceError(f"{p}: the file is empty")
    try:
        return json.loads(raw, parse_float=str)
    except UnicodeDecodeError:
        raise TraceError(f"{p}: not a JSON trace (the content is not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno}); "
                         "the trace may be truncated") from None
    except RecursionError:
        raise TraceError(f"{p}: JSON nested too deeply to be a trace") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits (int_max_str_digits)
        raise TraceError(f"{p}: not a JSON trace ({str(exc)[:120]})") from None


def us_to_ns(value: object) -> int | None:
    """Exact µs -> integer ns (half-even at sub-ns digits); None when not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return _int64(value * 1000)
    try:
        dec = value if isinstance(value, Decimal) else Decimal(str(value))
        if not dec.is_finite() or dec.adjusted() > _MAX_ADJUSTED:
            return None
        return _int64(int((dec * 1000).to_integral_value(rounding=ROUND_HALF_EVEN)))
    except (ArithmeticError, ValueError):  # decimal's InvalidOperation and Overflow are ArithmeticErrors
        return None


def as_int(value: object, default: int = -1) -> int:
    """An id that may be an int, an integral number's text ("7", "7.0"), or text such as
    "stream 7"; default otherwise (also for numbers that do not fit an int64)."""
    if isinstance(value, bool) or value is None:
        return default
    if isinstance(value, int):
        out = _int64(value)
        return default if out is None else out
    if isinstance(value, (str, Decimal)):
        try:
            dec = Decimal(value)
            if dec.is_finite() and dec.adjusted() > _MAX_ADJUSTED:
                return default
            if dec.is_finite() and dec == dec.to_integral_value():
                out = _int64(int(dec))
                return default if out is None else out
            return default
        except (ArithmeticError, ValueError):
            pass
        # the last 64 characters only: this search is quadratic in a long run of digits
        m = _TRAILING_INT.search(value[-64:]) if isinstance(value, str) else None
        out = _int64(int(m.group(1))) if m else None
        return default if out is None else out
    return default


def _events(doc: Any, path: str) -> list[Any]:
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{path}: not a Chrome/Kineto trace (no traceEvents list)")
    return events


def _device_names(doc: Any) -> tuple[str, ...]:
    props = doc.get("deviceProperties") if isinstance(doc, dict) else None
    if not isinstance(props, list):
        return ()
    return tuple(str(p.get("name")) for p in props if isinstance(p, dict) and p.get("name"))


def _meta(doc: Any) -> dict[str, str]:
    keys = ("schemaVersion", "cuda_runtime_version", "cuda_driver_version", "cupti_version")
    return {k: str(doc[k]) for k in keys if isinstance(doc, dict) and k in doc}


def parse_kineto(doc: Any, path: str = "<trace>") -> KernelTrace:
    """A KernelTrace from a parsed Kineto document (see read_json_document)."""
    events = _events(doc, path)
    gpu: dict[str, list[Any]] = {c: [] for c in KERNEL_COLUMNS}
    runtime: dict[str, list[Any]] = {c: [] for c in RUNTIME_COLUMNS}
    rng: dict[str, list[Any]] = {c: [] for c in ("name", "ts_ns", "dur_ns", "process", "thread", "kind")}
    flow_start: dict[int, tuple[int, int, int]] = {}
    flow_end: dict[tuple[int, int, int], int] = {}
    gpu_where: list[tuple[int, int]] = []  # each GPU event's own pid/tid, to find its "f" flow
    for e in events:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        cat = str(e.get("cat", "")).lower()
        if ph in ("s", "f") and cat == "ac2g":
            ts, fid = us_to_ns(e.get("ts")), as_int(e.get("id"))
            if ts is not None and fid >= 0:
                where = (as_int(e.get("pid")), as_int(e.get("tid")), ts)
                if ph == "s":
                    flow_start[fid] = where
                else:
                    flow_end[where] = fid
            continue
        if ph != "X":
            continue
        ts = us_to_ns(e.get("ts"))
        if ts is None:
            continue
        dur = max(us_to_ns(e.get("dur")) or 0, 0)
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if cat in _GPU_CATS:
            gpu["ts_ns"].append(ts)
            gpu["dur_ns"].append(dur)
            gpu["name"].append(str(e.get("name", "")))
            gpu["category"].append(_GPU_CATS[cat])
            gpu["device"].append(as_int(args.get("device", e.get("pid"))))
            gpu["stream"].append(as_int(args.get("stream", e.get("tid"))))
            gpu["correlation"].append(as_int(args.get("correlation")))
            gpu["grid"].append(format_dims(args["grid"]) if "grid" in args else None)
            gpu["block"].append(format_dims(args["block"]) if "block" in args else None)
            gpu["bytes"].append(max(as_int(args.get("bytes"), 0), 0))
            gpu_where.append((as_int(e.get("pid")), as_int(e.get("tid"))))
        elif cat in _LAUNCH_CATS:
            runtime["ts_ns"].append(ts)
            runtime["dur_ns"].append(dur)
            runtime["name"].append(str(e.get("name", "")))
            runtime["correlation"].append(as_int(args.get("correlation")))
            runtime["process"].append(as_int(e.get("pid")))
            runtime["thread"].append(as_int(e.get("tid")))
        elif cat in _RANGE_CATS:
            rng["name"].append(str(e.get("name", "")))
            rng["ts_ns"].append(ts)
            rng["dur_ns"].append(dur)
            rng["process"].append(as_int(e.get("pid")))
            rng["thread"].append(as_int(e.get("tid")))
            rng["kind"].append(_RANGE_CATS[cat])
    if not gpu["ts_ns"]:
        raise TraceError(f"{path}: the trace has no GPU kernel or memcpy events "
                         "(was it captured with ProfilerActivity.CUDA?)")
    for i, corr in enumerate(gpu["correlation"]):  # fill missing correlations from "f" flows
        if corr < 0:
            pid, tid = gpu_where[i]
            gpu["correlation"][i] = flow_end.get((pid, tid, gpu["ts_ns"][i]), -1)
    gpu["range_path"] = [""] * len(gpu["ts_ns"])
    gpu["step_id"] = [-1] * len(gpu["ts_ns"])
    gpu["source"] = ["kineto"] * len(gpu["ts_ns"])
    runtime["source"] = ["kineto"] * len(runtime["ts_ns"])
    rt = typed_frame(runtime, RUNTIME_COLUMNS)
    rt = rt[rt["correlation"] >= 0].sort_values("ts_ns", kind="stable").drop_duplicates("correlation")
    kernels = typed_frame(gpu, KERNEL_COLUMNS)
    ranges = pd.DataFrame(rng).assign(domain="", payload=pd.array([pd.NA] * len(rng["name"]), dtype="Int64"),
                                      source="kineto")
    kernels, nested = _attribute(kernels, rt, flow_start, ranges)
    return KernelTrace(kind="kineto", path=path, kernels=kernels.sort_values("ts_ns", kind="stable")
                       .reset_index(drop=True), ranges=nested, runtime=rt.reset_index(drop=True),
                       devices=_device_names(doc), meta=_meta(doc))


def _attribute(kernels: pd.DataFrame, runtime: pd.DataFrame, flow_start: dict[int, tuple[int, int, int]],
               ranges: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """kernels with range_path / step_id filled, and the public ranges frame (both kinds)."""
    n = len(kernels)
    path = np.full(n, "", dtype=object)
    step = np.full(n, -1, dtype=np.int64)
    nested_parts = []
    # Launch location per kernel: the runtime call with its correlation, else the "s" flow.
    # Kept in int64 with a mask: epoch-scale ns (~1.7e18) are not exact in float64.
    corr = kernels["correlation"].to_numpy(np.int64)
    at_row = pd.Index(runtime["correlation"].to_numpy(np.int64)).get_indexer(corr)
    known = at_row >= 0
    l_proc = np.full(len(corr), -1, dtype=np.int64)
    l_thr = np.full(len(corr), -1, dtype=np.int64)
    l_ts = np.zeros(len(corr), dtype=np.int64)
    l_proc[known] = runtime["process"].to_numpy(np.int64)[at_row[known]]
    l_thr[known] = runtime["thread"].to_numpy(np.int64)[at_row[known]]
    l_ts[known] = runtime["ts_ns"].to_numpy(np.int64)[at_row[known]]
    for i in np.flatnonzero(~known):
        where = flow_start.get(int(corr[i]))
        if where is not None:
            l_proc[i], l_thr[i], l_ts[i] = where
            known[i] = True
    for kind in ("cpu", "gpu"):
        part = ranges[ranges["kind"] == kind]
        if part.empty:
            continue
        nested = nest_ranges(part)
        nested_parts.append(nested)
        todo = path == ""
        if kind == "cpu":
            todo &= known
            proc, thr, at = l_proc[todo], l_thr[todo], l_ts[todo]
        else:
            proc = kernels["device"].to_numpy(np.int64)[todo]
            thr = kernels["stream"].to_numpy(np.int64)[todo]
            at = kernels["ts_ns"].to_numpy(np.int64)[todo]
        hit = enclosing_range(nested, proc, thr, at)
        rows = np.flatnonzero(todo)[hit >= 0]
        path[rows] = nested["path"].to_numpy(object)[hit[hit >= 0]]
        step[rows] = nested["step_id"].to_numpy(np.int64)[hit[hit >= 0]]
    if nested_parts:
        public = pd.concat(nested_parts, ignore_index=True).drop(columns=HELPER_COLUMNS)[list(RANGE_COLUMNS)]
        public = public.astype(RANGE_COLUMNS)
    else:
        public = typed_frame({c: [] for c in RANGE_COLUMNS}, RANGE_COLUMNS)
    return kernels.assign(range_path=path, step_id=step), public


def load_kineto(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> KernelTrace:
    """Read and parse a Kineto trace (.json or .json.gz) of at most `max_bytes`."""
    return parse_kineto(read_json_document(path, max_bytes), str(path))
