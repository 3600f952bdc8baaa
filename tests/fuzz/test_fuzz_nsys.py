"""nsys SQLite exports: seeded mutations of the public export (reduced to the tables the reader
uses) end in a KernelTrace or a TraceError, never another exception, a hang or an allocation storm.
Two kinds of mutation: bytes of the database file (pages the SQLite library must reject or read
as they are) and cells (a value of the wrong type or size put in a column the reader uses)."""
from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path
from typing import Callable

import pytest
from fuzzkit import case_count, check, mutations, run_fuzz
from real_inputs import NSYS_TABLES, nsys_seed

from infersight.kernels.errors import TraceError
from infersight.kernels.readers.load import load_trace

SEED = 1702
CELL_VALUES = (None, 2 ** 63 - 1, -2 ** 63, 2 ** 31, -1, 0, 1e308, float("inf"), float("-inf"), float("nan"), "text",
               "9" * 400, b"\xff\xfe\x00", "\ud800".encode("utf-8", "surrogatepass"), "x" * 70_000, 1.5)


def cell_mutations(seed_db: bytes, count: int, seed: int) -> list[bytes]:
    """`count` copies of the database with one to four cells of the read tables overwritten."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        conn = sqlite3.connect(":memory:")
        conn.deserialize(seed_db)
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'") if t in NSYS_TABLES]
        for _ in range(rng.randint(1, 4)):
            table = rng.choice(tables)
            columns = [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]
            rowids = [r for (r,) in conn.execute(f'SELECT rowid FROM "{table}"')]
            if not rowids:
                continue
            try:
                conn.execute(f'UPDATE "{table}" SET "{rng.choice(columns)}" = ? WHERE rowid = ?',
                             (rng.choice(CELL_VALUES), rng.choice(rowids)))
            except sqlite3.IntegrityError:  # a primary key keeps its type and uniqueness: that cell stays
                pass
        conn.commit()
        out.append(conn.serialize())
        conn.close()
    return out


def _decoder(folder: Path) -> Callable[[bytes], object]:
    path = folder / "case.sqlite"

    def decode(case: bytes) -> object:
        path.write_bytes(case)
        return load_trace(path, "nsys")
    return decode


@pytest.fixture(scope="module")
def seed_db() -> bytes:
    return nsys_seed()


def test_fuzz_nsys_cells(seed_db: bytes, tmp_path: Path) -> None:
    # A third of the cases: every cell case reads as a database, ~0.1 s each (pandas per table).
    decode = _decoder(tmp_path)
    assert len(decode(seed_db).kernels) > 0  # the seed reads, and the imports are done before the memory cap
    check("nsys cells", run_fuzz(decode, cell_mutations(seed_db, case_count(300) // 3, SEED), allowed=(TraceError,),
                                 per_case_s=5.0))


def test_fuzz_nsys_bytes(seed_db: bytes, tmp_path: Path) -> None:
    decode = _decoder(tmp_path)
    decode(seed_db)
    check("nsys bytes", run_fuzz(decode, mutations([seed_db], 2 * case_count(300) // 3, SEED), allowed=(TraceError,),
                                 per_case_s=5.0))


def test_regression_fifo_is_refused_without_opening(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.sqlite"
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    with pytest.raises(TraceError, match="FIFO"):
        load_trace(fifo, "nsys")


def test_regression_correlation_ids_equal_as_int64(seed_db: bytes, tmp_path: Path) -> None:
    # found by the 5,000-case run: a runtime row copied with correlationId c + 0.5 survives the
    # de-duplication (c != c + 0.5) and then equals c as int64: pandas' InvalidIndexError, a traceback
    conn = sqlite3.connect(":memory:")
    conn.deserialize(seed_db)
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    columns = [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")') if not row[5]]  # no primary key
    (rowid,) = conn.execute(f"SELECT rowid FROM {table} WHERE correlationId IN "
                            "(SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL) LIMIT 1").fetchone()
    names = ", ".join(f'"{c}"' for c in columns)
    conn.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {table} WHERE rowid = ?", (rowid,))
    conn.execute(f"UPDATE {table} SET correlationId = correlationId + 0.5 WHERE rowid = last_insert_rowid()")
    conn.commit()
    path = tmp_path / "dup.sqlite"
    path.write_bytes(conn.serialize())
    original = tmp_path / "seed.sqlite"
    original.write_bytes(seed_db)
    # the copy's kernels keep the launches (and so the ranges) they had
    assert load_trace(path, "nsys").kernels["range_path"].tolist() == load_trace(original, "nsys").kernels["range_path"].tolist()
