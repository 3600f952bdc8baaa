"""A capture's shapes file (written by infersight.probes.capture beside each capture): the model
shape and, step by step, who was in the batch, so the roofline can model the captured work.

    {"format": "infersight-capture-shapes/1", "model": {ModelConfig fields}, "dtype_bytes": 2,
     "first_step": 41, "steps": [{"step_id": 41, "phase": "decode", "seqs": [[request_id, tokens fed, KV length], ...]}]}

load_capture_shapes returns the model and a steps frame, one row per (step, sequence):
step_id, phase, request_id, query_len (tokens fed), context_len (KV length after the step) —
the input of infersight.kernels.analysis.roofline.steps_work / roofline_for_steps. first_step is the
engine step the window began with (steps that scheduled nothing have no entry).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from infersight.kernels.frames import TraceError, typed_frame
from infersight.kernels.readers.input_files import read_regular_file
from infersight.runtime.model.model_config import ModelConfig, model_config_from_dict

FORMAT = "infersight-capture-shapes/1"
SUFFIX = ".shapes.json"
PHASES = {"prefill", "decode", "mixed", "verify"}
STEP_COLUMNS = {"step_id": "int64", "phase": "object", "request_id": "int64", "query_len": "int64",
                "context_len": "int64"}
# Ranges a shapes file's numbers must be in: far above any real model or capture, and low enough that
# the roofline's products (tokens x context x heads x layers) and step_id + first_step stay finite
# and inside int64.
MAX_ID = 2 ** 52
MAX_TOKENS = 2 ** 24
MAX_SHAPES_BYTES = 256 << 20
MODEL_FIELD_LIMITS = {"d_model": 2 ** 20, "n_layers": 2 ** 12, "n_heads": 2 ** 14, "n_kv_heads": 2 ** 14,
                      "ffn_dim": 2 ** 22, "n_experts": 2 ** 16, "top_k": 2 ** 16, "vocab_size": 2 ** 24,
                      "max_seq_len": 2 ** 26}


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


def _whole(value: object, what: str, low: int, high: int) -> int:
    """An integer (an integral JSON number) in [low, high], else ValueError naming `what`: the
    roofline multiplies these, so an unchecked 1e308 ends as an int64 overflow further on."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be an integer, got {str(value)[:40]!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise OverflowError(f"{what} must be an integer, got {value}")
    if not (low <= value <= high) or value != int(value):
        raise ValueError(f"{what} must be an integer from {low} to {high}, got {str(value)[:40]}")
    return int(value)


def _model(fields: object) -> ModelConfig:
    if not isinstance(fields, dict):
        raise TypeError("model must be an object of ModelConfig fields")
    for name, value in fields.items():
        high = MODEL_FIELD_LIMITS.get(name)
        if high is not None:
            _whole(value, f"model.{name}", 0, high)
    return model_config_from_dict(fields)


def _rows(steps: object) -> list[tuple[int, str, int, int, int]]:
    if not isinstance(steps, list):
        raise TypeError("steps must be a list")
    rows = []
    for st in steps:
        step_id = _whole(st["step_id"], "step_id", 0, MAX_ID)
        phase = str(st["phase"])[:40]
        for rid, n, ctx in st["seqs"]:
            rows.append((step_id, phase, _whole(rid, "request id", -MAX_ID, MAX_ID),
                         _whole(n, "tokens fed", 0, MAX_TOKENS), _whole(ctx, "KV length", 0, MAX_TOKENS)))
    return rows


def load_capture_shapes(path: str | Path, max_bytes: int = MAX_SHAPES_BYTES) -> CaptureShapes:
    """Parse a shapes file (a regular file of at most `max_bytes`); a TraceError that says what is
    wrong when it is not one, including numbers outside the ranges above."""
    p = Path(path)
    raw = read_regular_file(p, max_bytes)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{p}: not a shapes file (invalid JSON: {exc})") from None
    except (RecursionError, ValueError) as exc:  # deep nesting; an integer of over 4,300 digits
        raise TraceError(f"{p}: not a shapes file ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceError(f"{p}: not a shapes file (expected \"format\": \"{FORMAT}\")")
    try:
        model = _model(doc["model"])
        dtype_bytes = _whole(doc["dtype_bytes"], "dtype_bytes", 1, 16)
        rows = _rows(doc["steps"])
        first_step = doc.get("first_step")
        first_step = None if first_step is None else _whole(first_step, "first_step", 0, MAX_ID)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise TraceError(f"{p}: malformed shapes file ({type(exc).__name__}: {str(exc)[:160]})") from None
    if any(n < 1 or ctx < n for _, _, _, n, ctx in rows):
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
