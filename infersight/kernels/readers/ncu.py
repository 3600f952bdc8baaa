"""Nsight Compute CSV (`ncu --csv`, details or raw page) -> KernelTrace.

The text may hold other output around the table: "==PROF==" / "==WARNING==" lines and the
application's own stdout; only quoted CSV lines from the header on are read.
- details page (the default): one row per (kernel, metric) with "Section Name", "Metric Name",
  "Metric Unit", "Metric Value", plus rule rows ("Rule Name", "Rule Type", "Rule Description",
  "Estimated Speedup Type", "Estimated Speedup") that carry no metric. Metric rows may be shorter
  than the header (ncu ends them with a comma); missing fields read as "".
- raw page (`--page raw`): one row per kernel, one column per metric, and a units row right
  after the header (its "ID" is empty).

ncu replays kernels one at a time, so there is no timeline: the kernels frame places them back to
back (ts_ns = sum of the earlier durations) and KernelTrace.has_timeline is False. The kernels
frame's correlation column holds ncu's launch "ID" (the metrics frame's kernel_id). dur_ns comes from
gpu__time_duration (raw page, or --metrics) or the details page's "Duration"; 0 when neither was
collected. Values are converted to base units by infersight.kernels.readers.units.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd

from infersight.kernels.frames import (
    KERNEL_COLUMNS, METRIC_COLUMNS, RULE_COLUMNS, KernelTrace, TraceError, format_dims, typed_frame,
)
from infersight.kernels.readers.input_files import MAX_FILE_BYTES, read_regular_file
from infersight.kernels.readers.kineto import as_int
from infersight.kernels.readers.units import parse_number, to_base_unit

#: Metric names that give a kernel's duration, most specific first.
DURATION_METRICS = ("gpu__time_duration.sum", "gpu__time_duration.avg", "gpu__time_duration", "Duration")
#: A kernel duration above a day is a garbled number, read as "not collected" (0).
MAX_KERNEL_NS = 86_400 * 10 ** 9
# Columns that describe the launch rather than a metric (raw page).
_IDENTITY = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time", "Context",
             "Stream", "Block Size", "Grid Size", "Device", "CC", "Section Name", "Function Name",
             "Demangled Name", "Mangled Name"}


def _table(text: str, path: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    try:
        for i, line in enumerate(lines):
            header = next(csv.reader([line]), [])
            if header and header[0] == "ID" and "Kernel Name" in header:
                rows = [r + [""] * (len(header) - len(r)) for r in csv.reader(lines[i + 1:])]
                return header, rows
    except csv.Error as exc:  # e.g. a field over csv.field_size_limit() (131,072 characters)
        raise TraceError(f"{path}: not a readable Nsight Compute CSV table ({exc})") from None
    raise TraceError(f"{path}: no Nsight Compute CSV table (expected a header starting with \"ID\" and "
                     "naming \"Kernel Name\"; was ncu run with --csv?)")


def _metric_record(kid: int, name: str, section: str, metric: str, unit: str, text: str) -> list[object]:
    number = parse_number(text)
    if number is None:
        return [kid, name, section, metric, unit, np.nan, unit, text]
    value, base = to_base_unit(number, unit)
    return [kid, name, section, metric, unit, value, base, text]


def parse_ncu_csv(text: str, path: str = "<ncu>") -> KernelTrace:
    """A KernelTrace (kernels, metrics, rules; no ranges or runtime) from ncu's CSV text."""
    header, rows = _table(text, path)
    col = {name: i for i, name in enumerate(header)}
    details = {"Metric Name", "Metric Value"} <= col.keys()
    launches: dict[int, list[str]] = {}
    metrics: list[list[object]] = []
    rules: list[list[object]] = []
    metric_cols = [c for c in header if c not in _IDENTITY] if not details else []
    units: dict[str, str] = {}
    for row in rows:
        kid_text = row[col["ID"]].strip()
        if not kid_text:  # raw page: the units row
            units = {c: row[col[c]] for c in metric_cols}
            continue
        kid = as_int(kid_text)
        if kid < 0:
            continue
        launches.setdefault(kid, row)
        name = row[col["Kernel Name"]]
        get = (lambda c, r=row: r[col[c]] if c in col else "")
        if not details:
            metrics.extend(_metric_record(kid, name, "", c, units.get(c, ""), get(c)) for c in metric_cols)
        elif get("Metric Name"):
            metrics.append(_metric_record(kid, name, get("Section Name"), get("Metric Name"), get("Metric Unit"),
                                          get("Metric Value")))
        elif get("Rule Name"):
            speedup = parse_number(get("Estimated Speedup"))
            rules.append([kid, name, get("Section Name"), get("Rule Name"), get("Rule Type"),
                          get("Rule Description"), get("Estimated Speedup Type"),
                          np.nan if speedup is None else speedup])
    if not launches:
        raise TraceError(f"{path}: the Nsight Compute table has no kernel rows")
    metric_frame = typed_frame({c: [m[i] for m in metrics] for i, c in enumerate(METRIC_COLUMNS)}, METRIC_COLUMNS)
    rule_frame = typed_frame({c: [r[i] for r in rules] for i, c in enumerate(RULE_COLUMNS)}, RULE_COLUMNS)
    return KernelTrace(kind="ncu", path=path, kernels=_kernel_frame(launches, col, metric_frame),
                       metrics=metric_frame, rules=rule_frame, has_timeline=False)


def _kernel_frame(launches: dict[int, list[str]], col: dict[str, int], metrics: pd.DataFrame) -> pd.DataFrame:
    ids = sorted(launches)
    dur = pd.Series(0, index=ids, dtype=np.int64)
    timed = metrics[(metrics["base_unit"] == "second") & metrics["value"].notna()]
    for metric in reversed(DURATION_METRICS):  # most specific last, so it wins
        per_kernel = timed[timed["metric"] == metric].drop_duplicates("kernel_id").set_index("kernel_id")["value"]
        ns = np.round(per_kernel.to_numpy() * 1e9)
        sane = (ns >= 0) & (ns <= MAX_KERNEL_NS)  # a garbled value is no duration, and no int64 overflow
        dur.loc[per_kernel.index[sane]] = ns[sane].astype(np.int64)
    dur_ns = dur.to_numpy(np.int64)
    if float(dur_ns.sum(dtype=np.float64)) >= 2.0 ** 63:
        raise TraceError("the kernel durations add up past what int64 nanoseconds can hold")
    field = (lambda kid, c: launches[kid][col[c]] if c in col else "")
    return typed_frame({
        "ts_ns": np.concatenate([[0], np.cumsum(dur_ns)[:-1]]).astype(np.int64), "dur_ns": dur_ns,
        "name": [field(k, "Kernel Name") for k in ids], "category": "kernel",
        "device": [as_int(field(k, "Device")) for k in ids], "stream": [as_int(field(k, "Stream")) for k in ids],
        "correlation": ids, "grid": [format_dims(field(k, "Grid Size")) for k in ids],
        "block": [format_dims(field(k, "Block Size")) for k in ids], "bytes": 0, "range_path": "",
        "step_id": -1, "source": "ncu"}, KERNEL_COLUMNS)


def load_ncu(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> KernelTrace:
    """Read an ncu CSV (.csv, or a .log holding ncu's output) of at most `max_bytes` into a KernelTrace."""
    p = Path(path)
    # a stray non-UTF-8 byte (application output) must not hide the table
    text = read_regular_file(p, max_bytes).decode("utf-8", errors="replace")
    return parse_ncu_csv(text, str(p))
