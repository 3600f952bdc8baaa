"""The decoded name columns (Categoricals) hold exactly the names a plain per-record lookup gives,
and keep comparing, sorting and concatenating as the strings do; the id lookup of slow_causes
matches pandas' get_indexer."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.frames import (
    REQUEST_EVENT_NAMES, EventFrames, concat_frames, request_frame, spec_frame,
)
from infersight.correlate.slow_causes import _positions
from infersight.probes.records import RecordKind, RequestEvent, record_dtype


def _requests(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rec = np.zeros(n, record_dtype(RecordKind.REQUEST))
    rec["ts_ns"] = np.arange(n) * 10
    rec["request_id"] = rng.integers(0, 50, n)
    rec["event"] = rng.choice([int(e) for e in RequestEvent] + [250], n)  # 250: no such event
    rec["reason"] = rng.integers(0, 4, n)
    rec["task_id"] = rng.integers(0, 6, n)  # 4, 5: ids without a label
    return rec


LABELS = {0: "other", 1: "code", 2: "json", 3: "chat"}


@pytest.mark.parametrize("seed", range(5))
def test_request_names_are_the_per_record_lookup(seed: int) -> None:
    rec = _requests(300, seed)
    frame = request_frame(rec, LABELS)
    # The reference: a dict lookup per record, in plain Python.
    assert frame["task"].tolist() == [LABELS.get(int(t), "other") for t in rec["task_id"]]
    assert frame["event"].tolist() == [REQUEST_EVENT_NAMES.get(int(e), "UNKNOWN") for e in rec["event"]]
    assert (frame["event"] == "FINISHED").tolist() == [int(e) == RequestEvent.FINISHED for e in rec["event"]]
    plain = frame.astype({"task": object, "event": object, "reason": object})
    # sorting and grouping by a name column goes by the names, as with strings
    assert frame.sort_values(["task", "ts_ns"])["ts_ns"].tolist() == plain.sort_values(["task", "ts_ns"])["ts_ns"].tolist()
    assert frame.groupby("event").size().to_dict() == plain.groupby("event").size().to_dict()
    assert pd.factorize(frame["task"], sort=True)[1].tolist() == sorted(set(plain["task"]))


def test_frames_with_different_names_concatenate_to_their_union() -> None:
    a, b = _requests(40, 1), _requests(30, 2)
    fa = request_frame(a, LABELS)
    fb = request_frame(b, {0: "other", 1: "creative"})  # another ring's labels
    both = concat_frames([fa, fb])
    assert isinstance(both["task"].dtype, pd.CategoricalDtype)
    assert both["task"].tolist() == fa["task"].tolist() + fb["task"].tolist()
    assert list(both["task"].dtype.categories) == sorted(set(fa["task"]) | set(fb["task"]))
    joined = EventFrames(request_events=fa).concat(EventFrames(request_events=fb)).request_events
    assert joined["task"].tolist() == both["task"].tolist()


def test_spec_task_names() -> None:
    rec = np.zeros(5, record_dtype(RecordKind.SPEC))
    rec["task_id"] = [3, 1, 9, 1, 0]
    assert spec_frame(rec, LABELS)["task"].tolist() == ["chat", "code", "other", "code", "other"]


@pytest.mark.parametrize("ids, values", [
    ([5, 3, 9, 4], [3, 4, 5, 6, 9, 10, -1, 2 ** 62]),                  # dense: the table
    ([1, 2 ** 40, 7], [7, 2 ** 40, 1, 0, 2 ** 40 + 1]),                 # sparse: binary search
    ([(1 << 48) + 2, (1 << 48) + 1], [(1 << 48) + 1, 2, 1 << 48, -(2 ** 63)]),  # a second ring's ids
    ([2 ** 63 - 1, 2 ** 63 - 2], [-(2 ** 63), 2 ** 63 - 1, 0]),           # extremes: no overflow
    ([], [1, 2]),
])
def test_id_positions_match_get_indexer(ids: list[int], values: list[int]) -> None:
    ids_a, values_a = np.array(ids, np.int64), np.array(values, np.int64)
    expected = pd.Index(ids_a).get_indexer(values_a)
    assert _positions(ids_a)(values_a).tolist() == expected.tolist()


def test_id_positions_random() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        span = int(rng.choice([10, 1000, 10 ** 9]))
        ids = rng.choice(span, size=min(span, int(rng.integers(1, 300))), replace=False).astype(np.int64)
        values = rng.integers(-5, span + 5, 500).astype(np.int64)
        assert _positions(ids)(values).tolist() == pd.Index(ids).get_indexer(values).tolist()


def test_step_groups_of_ordered_rows_are_factorize_and_stable_sort() -> None:
    from infersight.correlate.cost import _groups

    rng = np.random.default_rng(3)
    for case in range(100):
        steps = np.sort(rng.integers(0, 30, int(rng.integers(1, 200)))).astype(np.int64)
        if case % 2:
            rng.shuffle(steps)  # out of order: the general path
        group = pd.factorize(steps)[0]
        order = np.argsort(group, kind="stable")
        starts = np.flatnonzero(np.r_[True, group[order][1:] != group[order][:-1]])
        got = _groups(steps)
        assert [g.tolist() for g in got] == [group.tolist(), order.tolist(), starts.tolist()]
