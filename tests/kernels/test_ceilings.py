"""The roofline's ceilings: each value names its source (measured, datasheet, given), the lookup
takes them in that order of trust (given, measured, datasheet) and invents none."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infersight.kernels.ceilings.ceiling_cache import (
    CACHE_FORMAT, CeilingMeasurement, best_measurement, default_cache_path, read_cache, torch_version, write_cache,
)
from infersight.kernels.ceilings.ceiling_lookup import CeilingQuery, lookup_ceilings
from infersight.kernels.ceilings.device_ceilings import DATASHEETS, DeviceCeilings
from infersight.kernels.analysis.roofline import place_on_roofline


def _measurement(device: str = "NVIDIA H200", dtype: str = "bfloat16", torch: str | None = None,
                 at: str = "2026-12-01T10:00:00Z", gbps: float = 4123.0, tflops: float = 701.0) -> CeilingMeasurement:
    return CeilingMeasurement(device, dtype, torch or torch_version() or "none", "bench-host", at, "CUDA events",
                              gbps, 2 << 30, tflops, 8192, 20)


def _quoted_number(text: str, unit: str) -> float:
    """The number before `unit` in a datasheet quote ("1,979 TFLOPS" -> 1979)."""
    match = re.search(r"([\d,.]+) " + unit, text)
    assert match, (text, unit)
    return float(match.group(1).replace(",", ""))


@pytest.mark.parametrize("entry", DATASHEETS, ids=lambda e: e.device)
def test_datasheet_values_are_the_numbers_their_quotes_print(entry) -> None:
    """Each value against the datasheet's own words beside it: GB/s or TB/s as printed, tensor-core
    TFLOPS printed with sparsity halved for dense."""
    gbps, said = entry.gbps
    printed = _quoted_number(said, "TB/s") * 1000 if "TB/s" in said else _quoted_number(said, "GB/s")
    assert gbps == pytest.approx(printed)
    for dtype, (tflops, said) in entry.tflops.items():
        printed = _quoted_number(said, "TFLOPS")
        assert tflops == pytest.approx(printed / 2 if "with sparsity" in said else printed, rel=1e-3), dtype


def test_default_ceilings_are_a_datasheet_and_hand_made_ones_are_given() -> None:
    default = DeviceCeilings()
    assert (default.tflops_source.kind, default.gbps_source.kind) == ("datasheet", "datasheet")
    assert "H200" in default.tflops_source.detail and "4.8 TB/s" in default.gbps_source.detail
    hand = DeviceCeilings("hand", peak_tflops=1.0, peak_gbps=100.0)
    assert (hand.tflops_source.kind, hand.gbps_source.kind) == ("given", "given")
    mixed = DeviceCeilings("NVIDIA H200", peak_tflops=1.0, peak_gbps=default.peak_gbps)
    assert (mixed.tflops_source.kind, mixed.gbps_source.kind) == ("given", "datasheet")
    assert DeviceCeilings("x", 2.0, 50.0).ridge == pytest.approx(2e12 / 50e9)
    report = default.as_dict()
    assert report["tflops_source"]["kind"] == "datasheet" and report["known"] is True


def test_lookup_takes_given_then_measured_then_datasheet(tmp_path: Path) -> None:
    cache = tmp_path / "ceilings.json"
    sheet = lookup_ceilings("NVIDIA H200", "bfloat16", cache=cache).ceilings
    assert sheet is not None and (sheet.tflops_source.kind, sheet.gbps_source.kind) == ("datasheet", "datasheet")
    m = _measurement()
    write_cache(m, cache)
    measured = lookup_ceilings("NVIDIA H200", "bfloat16", cache=cache).ceilings
    assert measured is not None and (measured.peak_tflops, measured.peak_gbps) == (m.gemm_tflops, m.copy_gbps)
    assert measured.tflops_source.kind == measured.gbps_source.kind == "measured"
    for said in (measured.tflops_source.detail, measured.gbps_source.detail):
        assert "bench-host" in said and m.measured_at in said and "CUDA events" in said
    given = lookup_ceilings("NVIDIA H200", "bfloat16", peak_gbps=3000.0, cache=cache).ceilings
    assert given is not None and given.peak_gbps == 3000.0 and given.gbps_source.kind == "given"
    assert given.gbps_source.detail == "--peak-gbps" and given.tflops_source.kind == "measured"


def test_a_compute_peak_is_of_its_dtype_a_copy_of_any(tmp_path: Path) -> None:
    cache = tmp_path / "ceilings.json"
    m = _measurement(dtype="float32", tflops=55.0)
    write_cache(m, cache)
    c = lookup_ceilings("NVIDIA H200", "bfloat16", cache=cache).ceilings
    assert c is not None and c.gbps_source.kind == "measured" and c.peak_gbps == m.copy_gbps
    assert c.tflops_source.kind == "datasheet"  # the float32 GEMM says nothing of bf16 tensor cores


def test_an_unknown_device_gets_no_ceiling_and_the_reason(tmp_path: Path) -> None:
    lookup = lookup_ceilings("NVIDIA L4", "bfloat16", cache=tmp_path / "none.json")
    assert lookup.ceilings is None
    assert "NVIDIA L4" in lookup.missing and "infersight bench ceilings" in lookup.missing
    assert "--peak-tflops" in lookup.missing and lookup.as_dict()["known"] is False
    only_one = lookup_ceilings("NVIDIA L4", "bfloat16", peak_tflops=100.0, cache=tmp_path / "none.json")
    assert only_one.ceilings is None and only_one.missing.startswith("no memory-bandwidth ceiling known")
    both = CeilingQuery(peak_tflops=100.0, peak_gbps=200.0, cache=tmp_path / "none.json").lookup(["NVIDIA L4"], "fp8")
    assert both.ceilings is not None and both.ceilings.tflops_source.kind == "given"
    # Placed against no ceiling: achieved rates only (modelled work over measured time).
    work = pd.DataFrame({"op_category": ["GEMM"], "flops": [4e12], "bytes": [1e9]})
    row = place_on_roofline(work, pd.Series({"GEMM": 2_000_000_000}), None).iloc[0]
    assert row["achieved_tflops"] == pytest.approx(2.0) and row["achieved_gbps"] == pytest.approx(0.5)
    assert row["bound"] == "unknown" and all(math.isnan(row[c]) for c in ("roof_tflops", "pct_of_roof",
                                                                           "pct_of_peak_flops", "pct_of_peak_bw"))


def test_the_cache_keeps_one_entry_per_key_and_prefers_the_installed_torch(tmp_path: Path) -> None:
    cache = tmp_path / "sub" / "ceilings.json"
    mine = torch_version() or "none"
    write_cache(_measurement(torch=mine, at="2026-01-01T00:00:00Z", gbps=1.0), cache)
    write_cache(_measurement(torch="0.0-other", at="2026-12-31T00:00:00Z", gbps=2.0), cache)
    write_cache(_measurement(torch=mine, at="2026-02-01T00:00:00Z", gbps=3.0), cache)  # replaces the first
    entries = read_cache(cache)
    assert sorted(e.copy_gbps for e in entries) == [2.0, 3.0]
    assert json.loads(cache.read_text())["format"] == CACHE_FORMAT
    assert best_measurement(entries, "NVIDIA H200", "bfloat16", mine).copy_gbps == 3.0
    assert best_measurement(entries, "NVIDIA H200", "bfloat16", "9.9-unseen").copy_gbps == 2.0  # the newest
    assert best_measurement(entries, "NVIDIA H100 80GB HBM3", "bfloat16", mine) is None


@pytest.mark.parametrize("text", ["not json", json.dumps({"format": "other/1", "entries": []}),
                                  json.dumps({"format": CACHE_FORMAT, "entries": "x"}),
                                  json.dumps({"format": CACHE_FORMAT, "entries": [{"device": "NVIDIA H200"}]})])
def test_a_cache_that_is_not_ours_reads_as_empty(tmp_path: Path, text: str) -> None:
    cache = tmp_path / "ceilings.json"
    cache.write_text(text)
    assert read_cache(cache) == []
    assert lookup_ceilings("NVIDIA H200", "bfloat16", cache=cache).ceilings.gbps_source.kind == "datasheet"


def test_a_cache_entry_with_bad_numbers_is_dropped(tmp_path: Path) -> None:
    cache = tmp_path / "ceilings.json"
    good = _measurement()
    write_cache(good, cache)
    doc = json.loads(cache.read_text())
    for bad in (-1.0, float("nan"), True, "4000"):
        doc["entries"].append({**doc["entries"][0], "device": f"bad {bad!r}", "copy_gbps": bad})
    cache.write_text(json.dumps(doc))
    assert [e.device for e in read_cache(cache)] == [good.device]


def test_the_cache_path_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("INFERSIGHT_CEILINGS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "xdg" / "infersight" / "ceilings.json"
    monkeypatch.setenv("INFERSIGHT_CEILINGS", str(tmp_path / "mine.json"))
    assert default_cache_path() == tmp_path / "mine.json"
    write_cache(_measurement(), None)
    assert len(read_cache()) == 1 and np.isclose(read_cache()[0].copy_gbps, _measurement().copy_gbps)
