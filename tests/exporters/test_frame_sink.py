"""exporters.parquet.FrameSink: every row written comes back, in order, with its values; a sparse stream's
many small batches are joined as they come (its buffer costs its rows, not its polls) and reach the file by
row count or by age, each a row group; a column typed null in some polls is promoted, not refused."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from infersight.exporters.parquet import FrameSink


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def batch(start: int, rows: int = 3) -> pd.DataFrame:
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pd.DataFrame({"request_id": ids, "value": ids * 0.5, "task": [f"t{i % 2}" for i in ids]})


def test_every_row_comes_back_and_batches_are_joined_as_they_come(tmp_path: Path) -> None:
    clock = Clock()
    sink = FrameSink(tmp_path, rows_per_group=1000, flush_s=300.0, compact_every=4, clock=clock)
    for k in range(10):  # 10 polls of 3 rows: joined at the 4th, 7th and 10th (4 batches each time)
        sink.write_table("steps", batch(3 * k))
        assert sink.buffered("steps") == ([1, 2, 3, 1, 2, 3, 1, 2, 3, 1][k], 3 * (k + 1))
    sink.close()
    got = pq.read_table(tmp_path / "steps.parquet").to_pandas()
    pd.testing.assert_frame_equal(got, pd.concat([batch(3 * k) for k in range(10)], ignore_index=True))
    assert pq.ParquetFile(tmp_path / "steps.parquet").metadata.num_row_groups == 1  # one flush, at close


def test_a_buffer_reaches_the_file_by_rows_or_by_age(tmp_path: Path) -> None:
    clock = Clock()
    sink = FrameSink(tmp_path, rows_per_group=6, flush_s=60.0, compact_every=64, clock=clock)
    sink.write_table("a", batch(0))
    sink.write_table("a", batch(3))  # 6 rows: a row group
    sink.write_table("b", batch(0))  # first batch of b at t=0
    clock.now = 59.0
    sink.write_table("b", batch(3, rows=1))  # 4 rows, 59 s: still buffered
    assert sink.buffered("b") == (2, 4)
    clock.now = 60.0
    sink.write_table("b", batch(4, rows=1))  # 60 s after its first batch: a row group
    assert sink.buffered("b") == (0, 0)
    sink.write_table("b", batch(5, rows=2))
    sink.close()
    assert [pq.ParquetFile(tmp_path / f"{n}.parquet").metadata.num_row_groups for n in ("a", "b")] == [1, 2]
    assert pq.read_table(tmp_path / "b.parquet").column("request_id").to_pylist() == list(range(7))


def test_a_column_null_in_some_polls_is_promoted_when_joined(tmp_path: Path) -> None:
    sink = FrameSink(tmp_path, compact_every=2)
    sink.write_table("x", pd.DataFrame({"request_id": [1], "task": [None]}))  # task typed null here
    sink.write_table("x", pd.DataFrame({"request_id": [2], "task": ["code"]}))
    sink.close()
    assert pq.read_table(tmp_path / "x.parquet").to_pydict() == {"request_id": [1, 2], "task": [None, "code"]}
