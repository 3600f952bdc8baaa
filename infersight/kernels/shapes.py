"""A capture's shapes file (written by infersight.probes.capture beside each capture): the model
shape and, step by step, who was in the batch, so the roofline can model the captured work.

    {"format": "infersight-capture-shapes/1", "model": {ModelConfig fields}, "dtype_bytes": 2,
     "first_step": 41, "steps": [{"step_id": 41, "phase": "decode", "seqs": [[request_id, tokens fed, KV length], ...]}]}

load_capture_shapes returns the model and a steps frame, one row per (step, sequence):
step_id, phase, request_id, query_len (tokens fed), context_len (KV length after the step) —
the input of infersight.kernels.roofline.steps_work / roofline_for_steps. first_step is the
engine step the window began with (steps that scheduled nothing have no entry).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from infersight.kernels.frames import TraceError, typed_frame
from infersight.runtime.model_config import ModelConfig, model_config_from_dict

FORMAT = "infersight-capture-shapes/1"
SUFFIX = ".shapes.json"
PHASES = {"prefill", "decode", "mixed", "verify"}
STEP_COLUMNS = {"step_id": "int64", "phase": "object", "request_id": "int64", "query_len": "int64",
                "context_len": "int64"}


@dataclass(frozen=True)
class CaptureShapes:
    model: ModelConfig
    dtype_bytes: int
    first_step: int
    steps: pd.DataFrame


def shapes_path_for(capture_path: str | Path) -> Path:
    """Where a capture's shapes file is: the path itself when it is one, else beside the trace
    (capture-P-S.json.gz -> capture-P-S.shapes.json)."""
    p = Path(capture_path)
    if p.name.endswith(SUFFIX):
        return p
    stem = p.name.removesuffix(".gz").removesuffix(".json")
    return p.with_name(stem + SUFFIX)


def load_capture_shapes(path: str | Path) -> CaptureShapes:
    """Parse a shapes file; a TraceError that says what is wrong when it is not one."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TraceError(f"{p}: cannot read the shapes file ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{p}: not a shapes file (invalid JSON: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceError(f"{p}: not a shapes file (expected \"format\": \"{FORMAT}\")")
    try:
        model = model_config_from_dict(doc["model"])
        dtype_bytes = int(doc["dtype_bytes"])
        rows = [(int(st["step_id"]), str(st["phase"]), int(rid), int(n), int(ctx))
                for st in doc["steps"] for rid, n, ctx in st["seqs"]]
        first_step = doc.get("first_step")
        first_step = None if first_step is None else int(first_step)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise TraceError(f"{p}: malformed shapes file ({type(exc).__name__}: {exc})") from None
    if dtype_bytes < 1 or any(n < 1 or ctx < n for _, _, _, n, ctx in rows):
        raise TraceError(f"{p}: malformed shapes file (dtype_bytes >= 1, tokens >= 1 and KV length >= tokens)")
    unknown = sorted({phase for _, phase, _, _, _ in rows} - PHASES)
    if unknown:
        raise TraceError(f"{p}: malformed shapes file (unknown step phase {unknown[0]!r}; "
                         f"expected one of {', '.join(sorted(PHASES))})")
    steps = typed_frame({c: [r[i] for r in rows] for i, c in enumerate(STEP_COLUMNS)}, STEP_COLUMNS)
    if first_step is None:
        first_step = int(steps["step_id"].min()) if len(steps) else 0
    return CaptureShapes(model, dtype_bytes, int(first_step), steps)


def engine_step_ids(kernels: pd.DataFrame, ranges: pd.DataFrame, first_step: int) -> pd.DataFrame:
    """kernels with step_id as the engine numbers its steps. NVTX "step" ranges carry that id as
    their payload, so an nsys trace has it already; torch.profiler's record_function ranges have
    no payload, so a Kineto trace numbers its steps 0..N-1 from the window's first step."""
    steps = ranges[(ranges["name"] == "step") & (ranges["kind"] != "gpu")]
    if not steps.empty and steps["payload"].notna().all():
        return kernels
    return kernels.assign(step_id=np.where(kernels["step_id"] >= 0, kernels["step_id"] + first_step, -1))
