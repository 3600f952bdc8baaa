"""Real inputs to mutate, for the file and scrape fuzz tests: the public captures in
/work/shared/fixtures (never copied into the repository; a test that needs one is skipped, saying
why, when that folder is absent) and our own small test data (tests/kernels/data, tests/gpu/data).

Large captures are cut to a window of their events so that a case costs milliseconds: the window
keeps every event kind the reader handles (kernels, launches, annotations, flows, metadata).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import gzip
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from fuzzkit import INTERESTING

from infersight.runtime.model.model_config import MODEL_CONFIGS

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS.parents[1] / "shared" / "fixtures"
OUR_KINETO = TESTS / "kernels" / "data" / "kineto_tiny-moe.json.gz"
OUR_DCGM = TESTS / "gpu" / "data" / "dcgm_exporter_4_9_h200.prom"
#: The tables (and columns) infersight.kernels.readers.nsys reads; the rest of an export is left out of the seed.
NSYS_TABLES = ("StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
               "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "TARGET_INFO_GPU", "EXPORT_META_DATA",
               "META_DATA_EXPORT", "ENUM_NSYS_EVENT_TYPE", "ENUM_CUDA_MEMCPY_OPER")


#: What a JSON value is replaced with: fuzzkit's raw tokens (some not JSON at all) and values that are
#: valid JSON but wrong for the field (quoted huge numbers, containers where scalars belong, ...).
JSON_VALUES = INTERESTING + (b'"1e999999"', b'"-1e999"', b'"' + b"9" * 400 + b'"', b"1e308", b"-1e308", b"[]", b"{}",
                             b"[1, 2]", b'"kernel"', b'"X"', b'""', b"1.5", b"2.5e-9", b"true")


def _slots(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) inside `doc`, containers and leaves alike, so a value is picked
    uniformly: a trace's many event fields, not mostly its few top-level keys."""
    out: list[tuple[Any, Any]] = []
    todo = [doc]
    while todo:
        node = todo.pop()
        for key in (list(node) if isinstance(node, dict) else range(len(node))):
            out.append((node, key))
            if isinstance(node[key], (dict, list)):
                todo.append(node[key])
    return out


def value_mutations(seeds: list[bytes], count: int, seed: int) -> list[bytes]:
    """`count` seeded copies of JSON seeds with one to three values replaced by JSON_VALUES tokens
    (written raw, so `1e999999` stays a literal the reader's own parser sees)."""
    rng = random.Random(seed)
    docs = [json.loads(s) for s in seeds]
    out = []
    for _ in range(count):
        doc = copy.deepcopy(rng.choice(docs))
        tokens = []
        slots = _slots(doc)
        for k in range(rng.randint(1, 3)):
            parent, key = rng.choice(slots)
            parent[key] = f"@hole{k}@"  # a slot inside a value replaced before is harmlessly orphaned
            tokens.append((json.dumps(f"@hole{k}@").encode(), rng.choice(JSON_VALUES)))
        text = json.dumps(doc).encode()
        for hole, token in tokens:
            text = text.replace(hole, token)
        out.append(text)
    return out


def fixture(name: str) -> Path:
    """A public fixture's path, or the test is skipped with the reason."""
    path = FIXTURES / name
    if not path.is_file():
        pytest.skip(f"public fixture {name} is not in {FIXTURES} (see PROVENANCE.md there): nothing real to mutate")
    return path


def kineto_window(path: Path, events: int) -> bytes:
    """A Kineto trace's JSON text with its metadata and a window of `events` trace events taken
    around its first GPU kernel (so launches, ranges and flows of those kernels come along)."""
    doc = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
    all_events = doc["traceEvents"]
    first = next((i for i, e in enumerate(all_events) if str(e.get("cat", "")).lower() == "kernel"), 0)
    start = max(first - events // 2, 0)
    doc["traceEvents"] = all_events[start:start + events]
    return json.dumps(doc).encode()


def kineto_seeds() -> list[bytes]:
    """JSON text of our H200 capture's window, and of the public ones' when present."""
    seeds = [kineto_window(OUR_KINETO, 160)]
    for name in ("kineto_hta_param_torch_add_a100.json.gz", "kineto_hta_param_alexnet_a100.json.gz"):
        if (FIXTURES / name).is_file():
            seeds.append(kineto_window(FIXTURES / name, 160))
    return seeds


def nsys_seed(rows_per_table: int = 60) -> bytes:
    """The public nsys export reduced to the tables the reader uses, `rows_per_table` rows each."""
    src = sqlite3.connect(f"file:{fixture('nsys_saxpy_mpi_cuda_a100.sqlite')}?mode=ro", uri=True)
    dst = sqlite3.connect(":memory:")
    try:
        have = {name for (name,) in src.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for table in (t for t in NSYS_TABLES if t in have):
            (sql,) = src.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
            dst.execute(sql)
            rows = src.execute(f'SELECT * FROM "{table}" LIMIT {rows_per_table}').fetchall()
            if rows:
                dst.executemany(f'INSERT INTO "{table}" VALUES ({", ".join("?" * len(rows[0]))})', rows)
        dst.commit()
        dst.execute("VACUUM")
        return dst.serialize()
    finally:
        src.close()
        dst.close()


def shapes_seed() -> bytes:
    """A shapes file as infersight.probes.capture writes it: tiny-moe, prefill then decode steps."""
    steps = [{"step_id": 41, "phase": "prefill", "seqs": [[0, 17, 17], [1, 9, 9]]}]
    steps += [{"step_id": 42 + i, "phase": "decode", "seqs": [[0, 1, 18 + i], [1, 1, 10 + i]]} for i in range(6)]
    steps.append({"step_id": 48, "phase": "mixed", "seqs": [[0, 1, 24], [2, 5, 5]]})
    return json.dumps({"format": "infersight-capture-shapes/1", "model": dataclasses.asdict(MODEL_CONFIGS["tiny-moe"]),
                       "dtype_bytes": 2, "first_step": 41, "steps": steps}).encode()


def analyze_args(path: Path, fmt: str = "json", **flags: object) -> argparse.Namespace:
    """The `infersight analyze` flags as the command line parses them by default."""
    from infersight.cli import build_parser

    return build_parser().parse_args(["analyze", str(path), "--format", fmt, *(
        part for k, v in flags.items() for part in (f"--{k.replace('_', '-')}", str(v)))])
