"""FinishedRows (frames kept, dicts built when read) against a deque(maxlen) of to_dict("records") rows."""
from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd
import pytest

from infersight.agent.finished_rows import FinishedRows, row_dicts


def _frame(rng: np.random.Generator, first: int, n: int) -> pd.DataFrame:
    ttft = rng.random(n)
    ttft[rng.random(n) < 0.3] = np.nan
    return pd.DataFrame({"request_id": np.arange(first, first + n, dtype=np.int64), "ttft_s": ttft,
                         "task": pd.Series([f"t{i % 3}" for i in range(n)], dtype=object)})


@pytest.mark.parametrize("maxlen", [0, 1, 3, 7, 50, 1000])
def test_same_rows_as_a_bounded_deque(maxlen: int) -> None:
    rng = np.random.default_rng(maxlen)
    kept, reference, first = FinishedRows(maxlen), deque(maxlen=maxlen), 0
    for _ in range(40):
        n = int(rng.integers(0, 9))
        rows = _frame(rng, first, n)
        first += n
        kept.extend_frame(rows)
        reference.extend(rows.to_dict("records"))
        if rng.random() < 0.5:  # read at some polls only: the cache of dicts must not go stale
            assert [r["request_id"] for r in kept] == [r["request_id"] for r in reference]
        assert len(kept) == len(reference) and bool(kept) == bool(reference)
    got, want = list(kept), list(reference)
    assert [r["request_id"] for r in got] == [r["request_id"] for r in want]
    assert [repr(r["ttft_s"]) for r in got] == [repr(r["ttft_s"]) for r in want]
    assert [r["task"] for r in got] == [r["task"] for r in want]
    framed = [v for f in kept.frames() for v in f["request_id"].tolist()]
    assert framed == [r["request_id"] for r in want]
    if want:
        assert repr(kept[0]) == repr(want[0]) and repr(kept[-1]) == repr(want[-1])


def test_rows_are_a_snapshot() -> None:
    rows = pd.DataFrame({"request_id": np.array([1, 2], np.int64), "ttft_s": [0.5, 0.25]})
    kept = FinishedRows(10)
    kept.extend_frame(rows)
    rows.loc[0, "ttft_s"] = 9.0  # the caller changes its frame after handing it over
    rows["extra"] = 1
    assert list(kept) == [{"request_id": 1, "ttft_s": 0.5}, {"request_id": 2, "ttft_s": 0.25}]


def test_row_dicts_are_to_dict_records() -> None:
    rows = _frame(np.random.default_rng(1), 5, 6)
    assert repr(row_dicts(rows)) == repr(rows.to_dict("records"))
