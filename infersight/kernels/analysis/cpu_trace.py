"""A Kineto trace with no GPU activity (a CPU build of an engine, e.g. vLLM on our CPU machines):
its CPU ops as the activities, and the report worded for CPU time.

Which time: each CPU op's exclusive time (its span minus its child ops'), as the stretches it
really ran (`exclusive_segments`), so nothing is counted twice and the segments of a thread never
overlap: oneDNN's GEMM op has small child ops (allocations) and the compiled graph's wrapper op
has the whole layer stack inside it, and each keeps only its own time. Time between a thread's
top-level ops (the interpreter, scheduling) is idle in the step window: the CPU's counterpart of
the launch gaps `timeline.phase_breakdown` measures on a GPU.

How they are categorised: by name and enclosing ranges with the same rules as GPU kernels
(categories.py, which knows the CPU GEMM names: oneDNN / mkldnn / aten::mm and friends);
view ops (as_strided, slice, view, ...) and host syncs (item) land in "other".

How they are reported: `cpu_report` is `report.build_report` over the leaf ops, with every share
of CPU op time, `kernels` and `gpu_activity` at zero (there are none), `cpu_ops` and
`cpu_activity` holding the op totals, `device_kind: "cpu"`, and findings in CPU words (the
thresholds are those of findings.py): time outside ops per phase, heavy categories, one dominant op.

Frame columns (KernelTrace.kernels), one row per segment: name (the op's), category "cpu_op",
device = process id, stream = thread id, correlation = the op call's Kineto "External id" (so
calls are counted as distinct correlations; segments of one call share it), grid / block None,
bytes 0. Counts in the report (categories, top ops, phases) are op calls, not segments.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from infersight.kernels.analysis import findings as rules
from infersight.kernels.analysis.categories import classify
from infersight.kernels.analysis.findings import Finding
from infersight.kernels.frames import (
    GPU_CATEGORIES, KERNEL_COLUMNS, RANGE_COLUMNS, KernelTrace, TraceError, empty_frame, typed_frame,
)
from infersight.kernels.readers.kineto import as_int, us_to_ns
from infersight.kernels.readers.ranges import HELPER_COLUMNS, enclosing_range, nest_ranges
from infersight.kernels.analysis.report import build_report

CPU_CATEGORY = "cpu_op"
_DEVICE_CATS = frozenset(GPU_CATEGORIES) | {"memcpy", "memset"}  # older traces' spellings too
_CPU_ACTIONS = {
    "elementwise": "fuse chains of small ops (torch.compile), or use fused norm / activation ops",
    "sampling": "sample with a fused op (no full-vocabulary sort) and keep the logits in one contiguous batch",
    "memcpy": "avoid copies between steps: reuse preallocated buffers",
    "MoE routing": "use a fused top-k gating op instead of softmax + sort + gather",
    "MoE experts": "use a fused MoE op (grouped GEMM) instead of per-expert gathers and copies",
    "communication": "overlap collectives with compute, or use fewer ranks on one host",
}


def has_device_activity(doc: Any) -> bool:
    """Whether a parsed Kineto document holds any GPU kernel, memcpy or memset event."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return isinstance(events, list) and any(
        isinstance(e, dict) and e.get("ph") == "X" and str(e.get("cat", "")).lower() in _DEVICE_CATS for e in events)


def _events(doc: Any, cat: str) -> pd.DataFrame:
    """name, ts_ns, dur_ns, process, thread, op_id (Kineto's "External id", else -1), payload (NA) of
    the "X" events of one category."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    rows = []
    for e in events if isinstance(events, list) else ():
        if not isinstance(e, dict) or e.get("ph") != "X" or str(e.get("cat", "")).lower() != cat:
            continue
        ts = us_to_ns(e.get("ts"))
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if ts is not None:
            rows.append((str(e.get("name", "")), ts, max(us_to_ns(e.get("dur")) or 0, 0), as_int(e.get("pid")),
                         as_int(e.get("tid")), as_int(args.get("External id"))))
    frame = pd.DataFrame(rows, columns=["name", "ts_ns", "dur_ns", "process", "thread", "op_id"])
    frame = frame.astype({"name": object, "ts_ns": np.int64, "dur_ns": np.int64, "process": np.int64,
                          "thread": np.int64, "op_id": np.int64})
    return frame.assign(payload=pd.array([pd.NA] * len(frame), dtype="Int64"))


def exclusive_segments(nested: pd.DataFrame) -> pd.DataFrame:
    """One row per stretch of an op's own time (its span minus its children's), from nest_ranges
    output: row (the op's position in `nested`), ts_ns, dur_ns. Ops on one thread nest, so the
    segments never overlap and their sum is the time spent in ops."""
    ts = nested["ts_ns"].to_numpy(np.int64)
    end = nested["end_clip_ns"].to_numpy(np.int64)
    parent = nested["parent"].to_numpy(np.int64)
    cursor = ts.copy()  # per op: where its own time resumes after the children seen so far
    rows, starts, durs = [], [], []
    for i in range(len(nested)):  # rows are in start order within a thread: children follow their parent
        p = parent[i]
        if p >= 0:
            if ts[i] > cursor[p]:
                rows.append(p), starts.append(cursor[p]), durs.append(ts[i] - cursor[p])
            cursor[p] = max(cursor[p], end[i])
    for i in range(len(nested)):
        if end[i] > cursor[i]:
            rows.append(i), starts.append(cursor[i]), durs.append(end[i] - cursor[i])
    return pd.DataFrame({"row": np.asarray(rows, np.int64), "ts_ns": np.asarray(starts, np.int64),
                         "dur_ns": np.asarray(durs, np.int64)})


def parse_cpu_ops(doc: Any, path: str = "<trace>") -> KernelTrace:
    """A KernelTrace whose kernels are the CPU ops' exclusive segments (see the module docstring),
    each with the range_path / step_id of the user_annotation ranges around it."""
    ops = _events(doc, CPU_CATEGORY)
    if ops.empty:
        raise TraceError(f"{path}: the trace has neither GPU activity nor CPU ops (cpu_op events)")
    nested_ops = nest_ranges(ops)
    seg = exclusive_segments(nested_ops)
    op = nested_ops.iloc[seg["row"].to_numpy()].reset_index(drop=True)
    op_id = np.where(op["op_id"].to_numpy(np.int64) >= 0, op["op_id"].to_numpy(np.int64),
                     -2 - seg["row"].to_numpy(np.int64))  # no External id: still one id per call
    ranges = _events(doc, "user_annotation").drop(columns="op_id").assign(kind="cpu", domain="", source="kineto")
    n = len(seg)
    path_col = np.full(n, "", dtype=object)
    step_col = np.full(n, -1, dtype=np.int64)
    public = empty_frame(RANGE_COLUMNS)
    if not ranges.empty:
        nested = nest_ranges(ranges)
        hit = enclosing_range(nested, op["process"].to_numpy(np.int64), op["thread"].to_numpy(np.int64),
                              seg["ts_ns"].to_numpy(np.int64))
        path_col[hit >= 0] = nested["path"].to_numpy(object)[hit[hit >= 0]]
        step_col[hit >= 0] = nested["step_id"].to_numpy(np.int64)[hit[hit >= 0]]
        public = nested.drop(columns=HELPER_COLUMNS)[list(RANGE_COLUMNS)].astype(RANGE_COLUMNS)
    kernels = typed_frame({
        "ts_ns": seg["ts_ns"].to_numpy(np.int64), "dur_ns": seg["dur_ns"].to_numpy(np.int64),
        "name": op["name"].to_numpy(object), "category": [CPU_CATEGORY] * n,
        "device": op["process"].to_numpy(np.int64), "stream": op["thread"].to_numpy(np.int64),
        "correlation": op_id, "grid": [None] * n, "block": [None] * n, "bytes": [0] * n,
        "range_path": path_col, "step_id": step_col, "source": ["kineto"] * n}, KERNEL_COLUMNS)
    meta = {k: str(doc[k]) for k in ("schemaVersion",) if isinstance(doc, dict) and k in doc}
    return KernelTrace(kind="kineto", path=path, kernels=kernels.sort_values("ts_ns", kind="stable")
                       .reset_index(drop=True), ranges=public, meta=meta)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if 100 * x >= 1 or x == 0 else f"{100 * x:.2g}%"


def cpu_findings(report: dict[str, Any]) -> list[Finding]:
    """Findings over a report's phases, categories and top ops, in CPU words (findings.py thresholds)."""
    out = [Finding("info", "CPU-only trace: no GPU activity; times are the worker's CPU op times",
                   "on a GPU host, start the engine with CUDA profiling activities for kernel-level findings")]
    for p in report["phases"]:
        if p["share"] < rules.MIN_PHASE_SHARE or p["window_ns"] <= 0 or p["idle_share"] < rules.LAUNCH_BOUND_MEDIUM:
            continue
        per_step = f", {p['activities'] / p['steps']:.0f} ops per step" if p["steps"] else ""
        out.append(Finding("high" if p["idle_share"] >= rules.LAUNCH_BOUND_HIGH else "medium",
                           f"{p['phase']} spends {_pct(p['idle_share'])} of its step time between ops (Python, "
                           f"dispatch and scheduling; mean op {p['mean_kernel_ns'] / 1e3:.1f} µs{per_step})",
                           "batch more tokens per step, or compile the model into fewer, larger ops; on a GPU the "
                           "same overhead shows as launch gaps, which CUDA graphs remove"))
    for c in report["categories"]:
        limit = rules.CATEGORY_LIMITS.get(c["name"])
        if limit is not None and c["share"] >= limit:
            out.append(Finding("high" if c["share"] >= 2 * limit else "medium",
                               f"{c['name']} takes {_pct(c['share'])} of CPU op time ({c['count']} ops)",
                               _CPU_ACTIONS[c["name"]]))
    top = report["top_kernels"]
    if top and top[0]["share"] >= rules.TOP_KERNEL_SHARE:
        out.append(Finding("info", f"one op takes {_pct(top[0]['share'])} of CPU op time: {top[0]['name'][:80]}",
                           "profile it on its own (torch.profiler with record_shapes; ONEDNN_VERBOSE=1 for oneDNN)"))
    if not report["ranges"]:
        out.append(Finding("info", "no op is inside a record_function range, so there is no per-phase breakdown",
                           "wrap the engine's steps and phases in torch.profiler.record_function ranges"))
    return rules.sort_findings(out)


def _call_counts(report: dict[str, Any], trace: KernelTrace) -> None:
    """Counts in `report` as op calls (distinct correlations), not segments; means per call."""
    k = classify(trace.kernels)
    by = {key: k.groupby(key)["correlation"].nunique() for key in ("op_category", "name", "phase")}
    for row in report["categories"]:
        row["count"] = int(by["op_category"].get(row["name"], 0))
    for row in report["top_kernels"]:
        row["count"] = int(by["name"].get(row["name"], 0))
        row["mean_ns"] = row["total_ns"] / max(row["count"], 1)
    for row in report["phases"]:
        row["activities"] = int(by["phase"].get(row["phase"], 0))
        row["mean_kernel_ns"] = row["kernel_ns"] / max(row["activities"], 1)


def cpu_report(trace: KernelTrace, top: int = 10) -> dict[str, Any]:
    """build_report over a CPU-op trace (parse_cpu_ops), reworded as the module docstring says."""
    report = build_report(trace, top=top)
    _call_counts(report, trace)
    report["cpu_ops"] = {"count": int(trace.kernels["correlation"].nunique()),
                         "total_ns": report["gpu_activity"]["total_ns"]}
    report["cpu_activity"] = {**report["gpu_activity"], "count": report["cpu_ops"]["count"]}
    report["kernels"] = {"count": 0, "total_ns": 0}
    report["gpu_activity"] = {"count": 0, "total_ns": 0, "busy_ns": 0, "span_ns": 0}
    report["device_kind"] = "cpu"
    report["roofline"] = []  # the ceilings are a GPU's
    report["findings"] = [f.as_dict() for f in cpu_findings(report)]
    return report
