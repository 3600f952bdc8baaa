"""Kineto JSON traces: seeded mutations of real traces through `infersight analyze`'s whole analysis
(read, parse, report) end in a report or a TraceError, never another exception, a hang or an
allocation storm; and the issue-17 cases by name."""
from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Callable

import pytest
from fuzzkit import case_count, check, mutations, run_fuzz
from real_inputs import analyze_args, kineto_seeds, value_mutations

from infersight.commands.analyze import report_text
from infersight.kernels.analysis.cpu_trace import has_device_activity, parse_cpu_ops
from infersight.kernels.errors import TraceError
from infersight.kernels.readers.kineto import as_int, parse_kineto, read_json_document, us_to_ns
from infersight.kernels.readers.load import malformed_as_trace_error

SEED = 1701


def _decoder(folder: Path, whole_report: bool) -> Callable[[bytes], object]:
    """bytes -> a file -> what `infersight analyze` does with it: the reader and parser only
    (both the GPU and the CPU-only path), or the whole report."""
    path = folder / "case.json"

    def parse(case: bytes) -> object:
        path.write_bytes(case)
        if whole_report:
            return report_text(analyze_args(path))
        doc = read_json_document(path)
        with malformed_as_trace_error(path, "kineto"):
            return parse_kineto(doc, str(path)) if has_device_activity(doc) else parse_cpu_ops(doc, str(path))
    return parse


def test_fuzz_kineto_parse(tmp_path: Path) -> None:
    seeds = kineto_seeds()
    half = case_count(300) // 2
    cases = (mutations(seeds + [gzip.compress(seeds[0], mtime=0)], half, seed=SEED)
             + value_mutations(seeds, half, seed=SEED))
    decode = _decoder(tmp_path, whole_report=False)
    decode(seeds[0])  # the seed parses, and the imports are done before the child's memory cap
    check("kineto parse", run_fuzz(decode, cases, allowed=(TraceError,), per_case_s=5.0))


def test_fuzz_kineto_report(tmp_path: Path) -> None:
    # The report costs ~0.3 s a case (pandas), so fewer cases: values that still parse, through all of it.
    seeds = kineto_seeds()
    cases = value_mutations(seeds, max(case_count(300) // 25, 12), seed=SEED + 1)
    decode = _decoder(tmp_path, whole_report=True)
    json.loads(decode(seeds[0]))
    check("kineto report", run_fuzz(decode, cases, allowed=(TraceError,), per_case_s=10.0))


def _trace(tmp_path: Path, event: dict[str, object], name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text('{"traceEvents": [' + json.dumps(event).replace('"@', "").replace('@"', "") + "]}")
    return path


def _kernel(**fields: object) -> dict[str, object]:
    return {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7,
            "args": {"correlation": 3}, **fields}


def test_regression_ts_1e999999_is_not_a_timestamp(tmp_path: Path) -> None:
    # was: decimal.Overflow from Decimal("1e999999") * 1000; the event is skipped, so no kernels remain
    path = _trace(tmp_path, _kernel(ts="@1e999999@"))
    with pytest.raises(TraceError, match="no GPU kernel"):
        report_text(analyze_args(path))
    assert us_to_ns("1e999999") is None and us_to_ns("-1e999") is None and us_to_ns("1.5") == 1500


def test_regression_huge_number_in_an_id_field_is_fast(tmp_path: Path) -> None:
    # was: 32 s for a 113-byte file (int(Decimal("1e999999")) builds a million-digit integer)
    path = _trace(tmp_path, _kernel(pid="@1e999999@", tid="9" * 400, args={"correlation": "@1e999999@"}))
    assert path.stat().st_size < 600  # the 400-digit tid is most of it
    start = time.monotonic()
    report = json.loads(report_text(analyze_args(path)))
    assert time.monotonic() - start < 5.0
    assert report["kernels"]["count"] == 1
    assert as_int("1e999999") == -1 and as_int("9" * 400) == -1 and as_int("x" + "9" * 100_000) == -1
    assert as_int("stream 7") == 7 and as_int("7.0") == 7


def test_regression_deep_nesting_and_long_integers(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    long_int = tmp_path / "long.json"
    long_int.write_text('{"traceEvents": [{"ts": ' + "9" * 5000 + "}]}")  # over int_max_str_digits
    for path in (deep, long_int):
        with pytest.raises(TraceError) as err:
            report_text(analyze_args(path))
        assert str(err.value).startswith(str(path))


def test_regression_gzip_bomb_stops_at_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b"[" + b" " * (8 << 20) + b"]"))  # 8 MiB of JSON in ~8 KiB
    with pytest.raises(TraceError, match="inflates to more than"):
        report_text(analyze_args(path, max_bytes=1 << 20))
