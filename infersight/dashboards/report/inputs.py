"""Everything the report reads from a run's output directory, loaded and checked once.

Required (a ValueError names what is missing and what writes it):
    summary.json            the agent's /api/v1/summary document (`infersight demo` writes it)
    requests.parquet        one row per request (infersight.exporters.parquet.SCHEMA)
    events/                 one Parquet file per probe stream (infersight.correlate.frames);
                            a stream without a file (e.g. no speculation) reads as empty
Optional (their figures are skipped with a note when absent):
    events/gpu.parquet or gpu_samples.parquet
                            GPU samples (infersight.gpu.frames.SAMPLE_COLUMNS), engine clock
    captures/*.json[.gz], captures/*.sqlite, captures/*.csv, capture-*.json.gz
                            profiler captures: Kineto, Nsight Systems (SQLite export), Nsight
                            Compute CSV, read by infersight.kernels
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from infersight.correlate.requests import REQUEST_FIELDS
from infersight.correlate import frames as F

#: The event streams the figures use -> their documented columns (what events/<name>.parquet must hold).
FRAME_COLUMNS: dict[str, dict[str, str]] = {
    "request_events": F.REQUEST_COLUMNS, "steps": F.STEP_COLUMNS, "batch": F.BATCH_COLUMNS,
    "kv_events": F.KV_COLUMNS, "moe": F.MOE_COLUMNS, "spec": F.SPEC_COLUMNS, "prefix": F.PREFIX_COLUMNS,
    "step_timing": F.STEP_TIMING_COLUMNS,
}
GPU_SAMPLE_FILES = ("events/gpu.parquet", "gpu_samples.parquet")
GPU_SAMPLE_COLUMNS = {"ts_ns": "int64", "gpu": "int64", "field": "object", "value": "float64"}
CAPTURE_PATTERNS = ("captures/*.json", "captures/*.json.gz", "captures/*.sqlite", "captures/*.csv",
                    "capture-*.json.gz")


@dataclass(frozen=True)
class RunData:
    """One run's inputs. missing_streams: event streams that had no file (read as empty)."""

    out_dir: Path
    summary: dict[str, Any]
    requests: pd.DataFrame
    events: F.EventFrames
    missing_streams: tuple[str, ...]
    gpu_samples: pd.DataFrame | None
    gpu_samples_path: Path | None
    captures: tuple[Path, ...]


def _read_parquet(path: Path, columns: dict[str, str], what: str) -> pd.DataFrame:
    """The file's table with at least `columns`, cast to their dtypes; ValueError when unreadable
    or a column is missing (an empty file still carries its schema, so columns are checked)."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"{path}: not a readable Parquet file ({exc})") from None
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: {what} lacks the columns {', '.join(missing)}")
    df = table.to_pandas()
    return df.astype({c: t for c, t in columns.items() if t != "object"})


def _summary(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or "requests" not in doc:
        raise ValueError(f"{path}: not an infersight summary (expected the agent's /api/v1/summary document)")
    return doc


def _gpu_samples(out: Path) -> tuple[pd.DataFrame | None, Path | None]:
    for name in GPU_SAMPLE_FILES:
        path = out / name
        if path.is_file():
            df = _read_parquet(path, GPU_SAMPLE_COLUMNS, "a GPU samples file")
            return df, path
    return None, None


def load_run(out_dir: str | Path) -> RunData:
    """Load and check a run directory (see the module docstring for what it must hold)."""
    out = Path(out_dir)
    if not out.exists():
        raise ValueError(f"{out}: no such directory (run `infersight demo --out {out}` to make one)")
    if not out.is_dir():
        raise ValueError(f"{out}: not a directory")
    required = {"summary.json": "the agent's summary", "requests.parquet": "per-request rows",
                "events": "the probe event streams"}
    missing = [name for name in required if not (out / name).exists()]
    if missing:
        listed = ", ".join(f"{name} ({required[name]})" for name in missing)
        raise ValueError(f"{out}: missing {listed}; `infersight demo` writes them, or "
                         "`infersight agent --parquet-dir` plus the agent's /api/v1/summary")
    if not (out / "events").is_dir():
        raise ValueError(f"{out / 'events'}: not a directory")
    summary = _summary(out / "summary.json")
    request_columns = {name: "object" for name in REQUEST_FIELDS}
    requests = _read_parquet(out / "requests.parquet", request_columns, "requests.parquet")
    streams: dict[str, pd.DataFrame] = {}
    absent = []
    for name, columns in FRAME_COLUMNS.items():  # the streams the figures use; the rest stay empty
        path = out / "events" / f"{name}.parquet"
        if path.is_file():
            streams[name] = _read_parquet(path, columns, f"the {name} stream")
        else:
            absent.append(name)
    gpu, gpu_path = _gpu_samples(out)
    captures = sorted({p for pattern in CAPTURE_PATTERNS for p in out.glob(pattern) if p.is_file()})
    return RunData(out, summary, requests, F.EventFrames(**streams), tuple(absent), gpu, gpu_path, tuple(captures))
