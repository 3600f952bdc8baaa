"""Nsight Compute CSV: seeded mutations of the public ncu details log (bytes, and single fields of
its quoted CSV) end in a KernelTrace or a TraceError, never another exception or a hang; and the
issue-17 case of a field longer than the csv module allows."""
from __future__ import annotations

import csv
import io
import random
from pathlib import Path
from typing import Callable

import pytest
from fuzzkit import case_count, check, mutations, run_fuzz
from real_inputs import JSON_VALUES, fixture

from infersight.kernels.errors import TraceError
from infersight.kernels.readers.load import load_trace
from infersight.kernels.readers.ncu import parse_ncu_csv

SEED = 1703
FIELD_VALUES = tuple(v.decode("latin-1") for v in JSON_VALUES) + ("1,234.5", "n/a", "(1, 2, 3)", "(99999999999999999999999, 1, 1)",
                                                                    "nsecond", "Gbyte/second", "%", "")


def field_mutations(text: str, count: int, seed: int) -> list[bytes]:
    """`count` copies of the CSV text with one to three fields of its table rows replaced."""
    rng = random.Random(seed)
    lines = text.splitlines()
    table = [i for i, ln in enumerate(lines) if ln.startswith('"')]
    out = []
    for _ in range(count):
        copy = list(lines)
        rows: dict[int, list[str]] = {}  # parsed from the seed once: a replaced field may be over csv's limit
        for _ in range(rng.randint(1, 3)):
            i = rng.choice(table)
            row = rows.setdefault(i, next(csv.reader([lines[i]])))
            row[rng.randrange(len(row))] = rng.choice(FIELD_VALUES)
            buf = io.StringIO()
            csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="").writerow(row)
            copy[i] = buf.getvalue()
        out.append("\n".join(copy).encode("utf-8", "surrogateescape"))
    return out


def _decoder(folder: Path) -> Callable[[bytes], object]:
    path = folder / "case.csv"

    def decode(case: bytes) -> object:
        path.write_bytes(case)
        return load_trace(path, "ncu")
    return decode


def test_fuzz_ncu(tmp_path: Path) -> None:
    seed = fixture("ncu_cublaslt_details.log").read_bytes()
    decode = _decoder(tmp_path)
    assert len(decode(seed).kernels) > 0  # the seed reads; imports done before the memory cap
    half = case_count(300) // 2
    cases = mutations([seed], half, SEED) + field_mutations(seed.decode(), half, SEED)
    check("ncu", run_fuzz(decode, cases, allowed=(TraceError,), per_case_s=5.0))


def test_regression_field_over_131072_characters() -> None:
    # was: _csv.Error "field larger than field limit (131072)" as a traceback
    text = '"ID","Kernel Name","Metric Name","Metric Value"\n"0","k","m","' + "x" * 131_073 + '"\n'
    with pytest.raises(TraceError, match="field larger than field limit"):
        parse_ncu_csv(text, "big.csv")


def test_regression_garbled_duration_is_no_overflow() -> None:
    # a 400-digit duration is "not collected" (0), not an int64 overflow or a numpy cast warning
    header = '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
    rows = ['"0","k","S","Duration","nsecond","' + "9" * 400 + '"', '"1","k2","S","Duration","nsecond","1e300"',
            '"2","k3","S","Duration","nsecond","2,500"']
    trace = parse_ncu_csv(header + "\n".join(rows) + "\n", "d.csv")
    assert trace.kernels["dur_ns"].tolist() == [0, 0, 2500]
