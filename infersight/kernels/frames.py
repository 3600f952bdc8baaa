"""The frames every kernel-level ingester produces, and the one error type they raise.

Ingesters (kineto, nsys, ncu) parse a capture once into these DataFrames; every analysis in
`infersight.kernels` is a pure function over them and never mutates its inputs. Times are
integer ns on the capture's own clock (`*_ns` columns, int64): Kineto's µs are converted exactly
from their decimal text, nsys is already in ns, ncu has no timeline (see ncu.py).

kernels     one row per GPU activity (kernel, memcpy, memset), ordered by ts_ns:
            ts_ns, dur_ns        start and duration
            name                 kernel name as the capture spells it (demangled where available)
            category             raw source category, lower case: kernel | gpu_memcpy | gpu_memset
            device, stream       device ordinal and stream id
            correlation          CUDA correlation id linking it to its launch (-1 unknown; for
                                 ncu, its launch ID, the metrics frame's kernel_id)
            grid, block          "(x,y,z)" or None (memcpy/memset)
            bytes                bytes moved by a memcpy/memset (0 for kernels)
            range_path           the enclosing NVTX / record_function range names joined by "/",
                                 outermost first ("step/forward.decode/layer.3.attention"); ""
                                 outside every range
            step_id              payload of the enclosing range named "step" when it has one, else
                                 the ordinal (0-based, by start time) of that "step" range; -1 none
            source               kineto | nsys | ncu
ranges      one row per annotation range: name, ts_ns, dur_ns, depth (0 outermost), path (its own
            range_path), process, thread (for GPU-side annotations: device and stream), kind
            (cpu: CPU-thread ranges, i.e. NVTX push/pop or record_function; gpu: Kineto's GPU-side
            copies of them; startend: NVTX start/end ranges, which do not nest), domain (NVTX
            domain name, "" otherwise), payload (nullable Int64), step_id (as for kernels), source
runtime     one row per CUDA runtime / driver API call (a launch or copy call on the CPU side),
            de-duplicated per correlation id: ts_ns, dur_ns, name, correlation, process, thread,
            source
metrics     ncu only, long format: kernel_id, name, section, metric, unit (as printed), value
            (float64, converted to base_unit; NaN when not numeric), base_unit (second, byte,
            byte/second, hz, ratio, or the printed unit when there is no conversion), text (the
            printed value)
rules       ncu only: kernel_id, name, section, rule, rule_type, description, speedup_type,
            speedup (float64, NaN when absent)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from infersight.kernels.errors import TraceError  # noqa: F401 - re-exported: readers raise it from here

KERNEL_COLUMNS: dict[str, str] = {
    "ts_ns": "int64", "dur_ns": "int64", "name": "object", "category": "object", "device": "int64",
    "stream": "int64", "correlation": "int64", "grid": "object", "block": "object", "bytes": "int64",
    "range_path": "object", "step_id": "int64", "source": "object"}
RANGE_COLUMNS: dict[str, str] = {
    "name": "object", "ts_ns": "int64", "dur_ns": "int64", "depth": "int64", "path": "object",
    "process": "int64", "thread": "int64", "kind": "object", "domain": "object", "payload": "Int64",
    "step_id": "int64", "source": "object"}
RUNTIME_COLUMNS: dict[str, str] = {
    "ts_ns": "int64", "dur_ns": "int64", "name": "object", "correlation": "int64", "process": "int64",
    "thread": "int64", "source": "object"}
METRIC_COLUMNS: dict[str, str] = {
    "kernel_id": "int64", "name": "object", "section": "object", "metric": "object", "unit": "object",
    "value": "float64", "base_unit": "object", "text": "object"}
RULE_COLUMNS: dict[str, str] = {
    "kernel_id": "int64", "name": "object", "section": "object", "rule": "object", "rule_type": "object",
    "description": "object", "speedup_type": "object", "speedup": "float64"}

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def empty_frame(columns: dict[str, str]) -> pd.DataFrame:
    """No rows, but the columns and dtypes (so empty results concatenate and compare cleanly)."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def typed_frame(data: dict[str, object], columns: dict[str, str]) -> pd.DataFrame:
    """A frame with exactly `columns`, in order and with their dtypes (empty input -> empty frame)."""
    frame = pd.DataFrame({c: data[c] for c in columns})
    return frame.astype(columns) if len(frame) else empty_frame(columns)


@dataclass(frozen=True)
class KernelTrace:
    """One parsed capture: the frames above plus what the capture says about itself.

    kind: kineto | nsys | ncu. devices: GPU names the capture records (may be empty).
    has_timeline: False for ncu, whose ts_ns are synthetic (kernels placed back to back).
    meta: what the capture says about its producer (versions), as text."""

    kind: str
    path: str
    kernels: pd.DataFrame
    ranges: pd.DataFrame = field(default_factory=lambda: empty_frame(RANGE_COLUMNS))
    runtime: pd.DataFrame = field(default_factory=lambda: empty_frame(RUNTIME_COLUMNS))
    metrics: pd.DataFrame = field(default_factory=lambda: empty_frame(METRIC_COLUMNS))
    rules: pd.DataFrame = field(default_factory=lambda: empty_frame(RULE_COLUMNS))
    devices: tuple[str, ...] = ()
    has_timeline: bool = True
    meta: dict[str, str] = field(default_factory=dict)


def format_dims(x: object, y: object = None, z: object = None) -> str | None:
    """"(x,y,z)" from three ints, a list of three, or ncu's "(x, y, z)" text; None when unknown."""
    if isinstance(x, str):
        parts = [p.strip() for p in x.strip().strip("()").split(",")]
        if len(parts) == 3 and all(p.lstrip("-").isdigit() and len(p) <= 20 for p in parts):
            return "(" + ",".join(str(int(p)) for p in parts) + ")"
        return None
    if isinstance(x, (list, tuple)):
        if len(x) != 3:
            return None
        x, y, z = x
    if x is None or y is None or z is None:
        return None
    try:
        return f"({int(x)},{int(y)},{int(z)})"  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
