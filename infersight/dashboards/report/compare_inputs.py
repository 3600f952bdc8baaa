"""A run as `infersight compare` reads it: a run's output folder, or an agent summary file alone.

A folder (what `infersight demo`, `demo --engine vllm` and `agent --parquet-dir` write) must hold
summary.json (the agent's /api/v1/summary document); requests.parquet (one row per request,
infersight.exporters.parquet.SCHEMA) is read when present, for percentiles with intervals. A JSON
file is taken as a summary document alone: the comparison then has its figures and no intervals.
Bad input raises ValueError with one line naming the path and what is wrong.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from infersight.correlate.requests import PARTS
from infersight.correlate.run_compare import LATENCY, RunInputs

SUMMARY_NAME = "summary.json"
REQUESTS_NAME = "requests.parquet"
#: The request columns the comparison reads (the rest of the file is left on disk).
REQUEST_COLUMNS = (*LATENCY, *PARTS)


def _summary_document(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(doc, dict) or "requests" not in doc:
        raise ValueError(f"{path}: not an infersight summary (expected the agent's /api/v1/summary document)")
    return doc


def load_compared_run(path: str | Path, name: str | None = None) -> RunInputs:
    """The run at `path` (a folder or a summary JSON file); name defaults to the path's name."""
    p = Path(path)
    label = name or p.name or str(p)
    if p.is_file():
        return RunInputs(label, _summary_document(p))
    if not p.is_dir():
        raise ValueError(f"{p}: no such run folder or summary file")
    if not (p / SUMMARY_NAME).is_file():
        raise ValueError(f"{p}: no {SUMMARY_NAME} (a run folder from `infersight demo --out`, or the agent's "
                         "/api/v1/summary saved as a file)")
    summary = _summary_document(p / SUMMARY_NAME)
    requests_path = p / REQUESTS_NAME
    if not requests_path.is_file():
        return RunInputs(label, summary)
    try:
        schema = pq.read_schema(requests_path)
        table = pq.read_table(requests_path, columns=[c for c in REQUEST_COLUMNS if c in schema.names])
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"{requests_path}: not a readable Parquet file ({exc})") from None
    missing = [c for c in LATENCY if c not in table.column_names]
    if missing:
        raise ValueError(f"{requests_path}: lacks the latency columns {', '.join(missing)}")
    return RunInputs(label, summary, table.to_pandas())
