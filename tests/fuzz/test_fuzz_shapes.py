"""Capture shapes files: seeded mutations (bytes and JSON values) of a shapes file as
infersight.probes.capture writes it end in the roofline's work table or a TraceError, never another
exception, a hang or an allocation storm; and the issue-17 case `first_step: 1e308` by name."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
from fuzzkit import case_count, check, mutations, run_fuzz
from real_inputs import shapes_seed, value_mutations

from infersight.kernels.errors import TraceError
from infersight.kernels.analysis.roofline import steps_work
from infersight.kernels.readers.shapes import MAX_ID, load_capture_shapes

SEED = 1704


def _decoder(folder: Path) -> Callable[[bytes], object]:
    path = folder / "capture-1-2.shapes.json"

    def decode(case: bytes) -> object:
        path.write_bytes(case)
        shapes = load_capture_shapes(path)
        work = steps_work(shapes.model, shapes.steps, shapes.dtype_bytes)  # the products the numbers feed
        assert (work["flops"] >= 0).all() and (work["bytes"] >= 0).all()
        return work
    return decode


def test_fuzz_shapes(tmp_path: Path) -> None:
    seed = shapes_seed()
    decode = _decoder(tmp_path)
    assert len(decode(seed)) > 0
    half = case_count(300) // 2
    check("shapes", run_fuzz(decode, mutations([seed], half, SEED) + value_mutations([seed], half, SEED),
                             allowed=(TraceError,), per_case_s=5.0))


@pytest.mark.parametrize("field,value", [("first_step", "1e308"), ("first_step", "-1"), ("dtype_bytes", "1e308"),
                                         ("first_step", "9" * 400), ("first_step", "1.5")])
def test_regression_numbers_out_of_range(field: str, value: str, tmp_path: Path) -> None:
    # was: OverflowError from first_step 1e308 (int64 step ids), as a traceback
    doc = json.loads(shapes_seed())
    path = tmp_path / "s.shapes.json"
    path.write_text(json.dumps({**doc, field: "@"}).replace('"@"', value))
    with pytest.raises(TraceError, match=f"malformed shapes file .*{field}"):
        load_capture_shapes(path)


def test_first_step_at_the_limit_is_read(tmp_path: Path) -> None:
    doc = json.loads(shapes_seed())
    path = tmp_path / "s.shapes.json"
    path.write_text(json.dumps({**doc, "first_step": MAX_ID}))
    assert load_capture_shapes(path).first_step == MAX_ID
