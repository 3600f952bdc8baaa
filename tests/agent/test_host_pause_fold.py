"""HostPauseFold on tiny frames: what it counts, and which pauses it keeps for the attribution."""
from __future__ import annotations

import pandas as pd
import pytest

from infersight.agent.folds import host_pause
from infersight.agent.folds.host_pause import HostPauseFold
from infersight.correlate.frames import HOST_PAUSE_COLUMNS
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter


def frame(*rows: tuple[int, int, int, int]) -> pd.DataFrame:
    """rows: (ts_ns, end_ns, generation, missed)."""
    return pd.DataFrame({"ts_ns": [r[0] for r in rows], "end_ns": [r[1] for r in rows], "collected": 0,
                         "missed": [r[3] for r in rows], "generation": [r[2] for r in rows],
                         "ring_index": 0}).astype(HOST_PAUSE_COLUMNS)


def fold() -> HostPauseFold:
    return HostPauseFold({C.HOST_PAUSE_SECONDS.name: LabelledCounter(), C.HOST_PAUSES.name: LabelledCounter()})


def test_pauses_are_counted_by_generation() -> None:
    f = fold()
    f.fold(frame((0, 10_000_000, 2, 0), (20_000_000, 26_000_000, 0, 0), (30_000_000, 130_000_000, 2, 3)))
    f.fold(frame())
    assert f.counters[C.HOST_PAUSE_SECONDS.name].values == {("0",): pytest.approx(0.006), ("2",): pytest.approx(0.11)}
    assert f.counters[C.HOST_PAUSES.name].values == {("0",): 1, ("2",): 2, ("unknown",): 3}
    assert f.window["end_ns"].tolist() == [10_000_000, 26_000_000, 130_000_000]


def test_the_window_keeps_what_a_request_in_flight_may_have_lived_through() -> None:
    f = fold()
    f.fold(frame((0, 10, 2, 0), (20, 30, 2, 0), (40, 50, 2, 0)))
    f.trim(30)  # the oldest request in flight arrived at 30: the pause that ended at 30 may be its
    assert f.window["ts_ns"].tolist() == [20, 40]
    f.trim(31)
    assert f.window["ts_ns"].tolist() == [40]
    f.trim(None)  # nothing in flight
    assert f.window.empty and list(f.window.columns) == list(HOST_PAUSE_COLUMNS)


def test_the_window_is_bounded_newest_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_pause, "MAX_HELD_PAUSES", 2)
    f = fold()
    f.fold(frame((0, 10, 1, 0), (20, 30, 1, 0)))
    f.fold(frame((40, 50, 1, 0)))
    assert f.window["ts_ns"].tolist() == [20, 40]
    assert f.counters[C.HOST_PAUSES.name].values == {("1",): 3}  # counted whatever is kept
