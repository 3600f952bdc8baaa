"""ncu CSV -> frames: the real details-page log checked by line parsing, unit handling, raw page."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import pytest

from infersight.kernels.frames import TraceError
from infersight.kernels.readers.ncu import load_ncu, parse_ncu_csv
from infersight.kernels.readers.units import parse_number, to_base_unit

LOG = "ncu_cublaslt_details.log"


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """Independent reading: quoted lines split on '","' (no field in this log contains it)."""
    lines = [ln.rstrip("\n").rstrip(",") for ln in path.read_text().splitlines() if ln.startswith('"')]
    split = [ln.strip('"').split('","') for ln in lines]
    return split[0], split[1:]


def test_details_page_against_line_parsing(shared_fixture: Callable[[str], Path]) -> None:
    path = shared_fixture(LOG)
    header, rows = _rows(path)
    col = {c: i for i, c in enumerate(header)}
    ids = {r[col["ID"]] for r in rows}
    metric_rows = [r for r in rows if r[col["Metric Name"]]]
    rule_rows = [r for r in rows if len(r) > col["Rule Name"] and r[col["Rule Name"]]]
    [duration] = [r for r in metric_rows if r[col["Metric Name"]] == "Duration"]
    assert duration[col["Metric Unit"]] == "ns"

    trace = load_ncu(path)
    assert trace.kind == "ncu" and not trace.has_timeline
    assert len(trace.kernels) == len(ids) == 1
    kernel = trace.kernels.iloc[0]
    assert kernel["dur_ns"] == int(duration[col["Metric Value"]])
    assert kernel["name"] == rows[0][col["Kernel Name"]]
    assert kernel["grid"] == "(9,32,1)" and kernel["block"] == "(384,1,1)" and kernel["stream"] == 7
    assert len(trace.metrics) == len(metric_rows) and len(trace.rules) == len(rule_rows)
    m = trace.metrics.set_index("metric")
    # Units: ns -> seconds, % -> ratio, hz stays hz, byte/block keeps its denominator.
    assert m.loc["Duration", "base_unit"] == "second"
    assert m.loc["Duration", "value"] == pytest.approx(int(duration[col["Metric Value"]]) * 1e-9)
    assert m.loc["Memory Throughput", "base_unit"] == "ratio"
    assert m.loc["Memory Throughput", "value"] == pytest.approx(0.2168)
    assert m.loc["SM Frequency", "base_unit"] == "hz" and m.loc["SM Frequency", "value"] == pytest.approx(1239496049.13)
    assert m.loc["Dynamic Shared Memory Per Block", "base_unit"] == "byte/block"
    # Text values stay text.
    assert math.isnan(m.loc["Cluster Scheduling Policy", "value"])
    assert m.loc["Cluster Scheduling Policy", "text"] == "PolicySpread"
    speedups = sorted(float(r[col["Estimated Speedup"]]) for r in rule_rows
                      if len(r) > col["Estimated Speedup"] and r[col["Estimated Speedup"]])
    assert sorted(trace.rules["speedup"].dropna()) == pytest.approx(speedups)


RAW = '''==PROF== Connected to process 42 (python3)
==PROF== Profiling "gemm": 0%....50%....100% - 9 passes
some application output
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","dram__throughput.avg.per_second","sm__cycles_elapsed.avg.per_second"
"","","","","","","","","","","","Mbyte","usecond","%","Gbyte/second","cycle/nsecond"
"0","42","python3","h","gemm_a","1","7","(128, 1, 1)","(80, 1, 1)","0","9.0","1,024.5","12.5","80.5","3,350.25","1.98"
"1","42","python3","h","norm_b","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","3","2,000","n/a","1.5","1.5"
==PROF== Disconnected from process 42
'''


def test_raw_page_units_row_and_thousands_separators() -> None:
    trace = parse_ncu_csv(RAW)
    assert list(trace.kernels["name"]) == ["gemm_a", "norm_b"]
    assert list(trace.kernels["dur_ns"]) == [12_500, 2_000_000]
    assert list(trace.kernels["ts_ns"]) == [0, 12_500]  # no timeline: back to back
    m = trace.metrics.set_index(["kernel_id", "metric"])
    assert m.loc[(0, "dram__bytes_read.sum"), "value"] == pytest.approx(1_024_500_000.0)
    assert m.loc[(0, "dram__bytes_read.sum"), "base_unit"] == "byte"
    assert m.loc[(0, "dram__throughput.avg.per_second"), "value"] == pytest.approx(3.35025e12)
    assert m.loc[(0, "dram__throughput.avg.per_second"), "base_unit"] == "byte/second"
    assert m.loc[(0, "sm__cycles_elapsed.avg.per_second"), "value"] == pytest.approx(1.98e9)
    assert m.loc[(0, "sm__cycles_elapsed.avg.per_second"), "base_unit"] == "cycle/second"
    assert m.loc[(0, "sm__throughput.avg.pct_of_peak_sustained_elapsed"), "value"] == pytest.approx(0.805)
    assert math.isnan(m.loc[(1, "sm__throughput.avg.pct_of_peak_sustained_elapsed"), "value"])


@pytest.mark.parametrize("value,unit,expected,base", [
    (406240, "ns", 406240e-9, "second"), (12.5, "usecond", 12.5e-6, "second"), (3, "msecond", 3e-3, "second"),
    (2, "Kbyte", 2000, "byte"), (1.5, "Gbyte", 1.5e9, "byte"), (4, "KiB", 4096, "byte"),
    (2.5, "Tbyte/s", 2.5e12, "byte/second"), (1.2, "Ghz", 1.2e9, "hz"), (50, "%", 0.5, "ratio"),
    (7, "cycle", 7, "cycle"), (3, "Kinst", 3000, "inst"), (9, "widgets", 9, "widgets"), (5, "", 5, ""),
])
def test_units(value: float, unit: str, expected: float, base: str) -> None:
    got, got_base = to_base_unit(value, unit)
    assert got == pytest.approx(expected) and got_base == base


def test_numbers() -> None:
    assert parse_number("1,234.5") == 1234.5 and parse_number("3,995,313,115.40") == pytest.approx(3995313115.4)
    assert parse_number("1.5e-05") == 1.5e-05 and parse_number("-3") == -3.0
    for text in ("n/a", "", "PolicySpread", "(9, 32, 1)", "1,23", "inf"):
        assert parse_number(text) is None, text


def test_no_table() -> None:
    with pytest.raises(TraceError, match="no Nsight Compute CSV table"):
        parse_ncu_csv("==PROF== Connected\nhello\n")
    header = '"ID","Process ID","Process Name","Host Name","Kernel Name","Metric Name","Metric Value"\n'
    with pytest.raises(TraceError, match="no kernel rows"):
        parse_ncu_csv(header)
