"""exporters.parquet.ParquetSink: the per-request rows come back in order with their values; a poll's few
rows are not a row group of their own (a row group per poll bloated the footer and the writer's memory):
rows are joined as they come and reach the file by row count or by age, each flush one row group."""
from __future__ import annotations

import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from infersight.correlate.requests import REQUEST_FIELDS
from infersight.exporters.parquet import ParquetSink


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def rows(start: int, n: int = 2) -> list[dict[str, object]]:
    """n request rows with ids from start; a few columns set, the rest absent (written as null)."""
    return [{"request_id": i, "task": f"t{i % 3}", "e2e_s": i * 0.25, "output_tokens": i + 1} for i in range(start, start + n)]


def test_every_row_comes_back_in_one_row_group_per_flush(tmp_path: Path) -> None:
    clock = Clock()
    sink = ParquetSink(tmp_path / "requests.parquet", rows_per_group=1000, flush_s=300.0, compact_every=4, clock=clock)
    for k in range(10):  # 10 polls of 2 rows: joined at the 4th, 7th and 10th
        sink.write(rows(2 * k))
        assert sink.buffered == ([1, 2, 3, 1, 2, 3, 1, 2, 3, 1][k], 2 * (k + 1))
    sink.write([])  # an empty poll: nothing
    assert sink.buffered == (1, 20) and sink.rows_written == 20 and sink.row_groups == 0
    sink.close()
    f = pq.ParquetFile(tmp_path / "requests.parquet")
    assert f.metadata.num_row_groups == 1 and f.metadata.num_rows == 20
    got = f.read().to_pylist()
    assert [r["request_id"] for r in got] == list(range(20))
    assert [r["e2e_s"] for r in got] == [i * 0.25 for i in range(20)]
    assert [r["task"] for r in got] == [f"t{i % 3}" for i in range(20)]
    assert all(r["queue_s"] is None for r in got) and list(got[0]) == list(REQUEST_FIELDS)


def test_rows_reach_the_file_by_count_or_by_age(tmp_path: Path) -> None:
    clock = Clock()
    sink = ParquetSink(tmp_path / "r.parquet", rows_per_group=5, flush_s=60.0, clock=clock)
    sink.write(rows(0, 3))
    sink.write(rows(3, 2))  # 5 rows: a row group
    assert sink.buffered == (0, 0) and sink.row_groups == 1
    sink.write(rows(5, 1))  # first rows of the next group at t=0
    clock.now = 59.0
    sink.write(rows(6, 1))
    assert sink.buffered == (2, 2)
    clock.now = 60.0
    sink.write(rows(7, 1))  # 60 s after the group's first rows: written
    assert sink.buffered == (0, 0) and sink.row_groups == 2
    sink.write(rows(8, 1))
    sink.close()
    f = pq.ParquetFile(tmp_path / "r.parquet")
    assert [f.metadata.row_group(i).num_rows for i in range(f.metadata.num_row_groups)] == [5, 3, 1]
    assert f.read().column("request_id").to_pylist() == list(range(9))


def test_a_day_of_polls_is_a_few_row_groups(tmp_path: Path) -> None:
    """8,640 polls (one every 10 s for a day) of 2 rows, defaults: a row group per 5 minutes (279), where a
    group per poll made 8,640."""
    clock = Clock()
    sink = ParquetSink(tmp_path / "r.parquet", clock=clock)
    for k in range(8640):
        clock.now = 10.0 * k
        sink.write(rows(2 * k))
    sink.close()
    meta = pq.ParquetFile(tmp_path / "r.parquet").metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sum(sizes) == 17_280 and max(sizes) <= 10_000
    # flush_s (300 s) comes first here: a group's first poll at t, the poll at t + 300 s writes it (31 polls,
    # 62 rows); the last group is what is left at close
    assert meta.num_row_groups == math.ceil(8640 / 31) and set(sizes[:-1]) == {62} and sizes[-1] == 8640 % 31 * 2


def test_close_twice_keeps_the_rows_and_no_rows_is_an_empty_file_with_the_schema(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path / "a.parquet")
    sink.write(rows(0, 3))
    sink.close()
    sink.close()
    assert pq.read_table(tmp_path / "a.parquet").num_rows == 3
    empty = ParquetSink(tmp_path / "b.parquet")
    empty.close()
    table = pq.read_table(tmp_path / "b.parquet")
    assert table.num_rows == 0 and table.column_names == list(REQUEST_FIELDS)
    with pytest.raises(ValueError):
        ParquetSink(tmp_path / "c.parquet", rows_per_group=0)
