"""Range nesting and the innermost-range lookup, on hand-built ranges with the edge cases."""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.kernels.readers.ranges import enclosing_range, nest_ranges


def _ranges(rows: list[tuple[str, int, int, int, int, object]]) -> pd.DataFrame:
    return pd.DataFrame({"name": [r[0] for r in rows], "ts_ns": [r[1] for r in rows],
                         "dur_ns": [r[2] for r in rows], "process": [r[3] for r in rows],
                         "thread": [r[4] for r in rows],
                         "payload": pd.array([r[5] for r in rows], dtype="Int64")})


RANGES = _ranges([
    ("A", 0, 100, 1, 1, None),
    ("B", 10, 40, 1, 1, None),      # [10, 50) inside A
    ("C", 50, 10, 1, 1, None),      # starts as B ends: B's sibling
    ("D", 60, 0, 1, 1, None),       # empty: encloses nothing
    ("G", 90, 40, 1, 1, None),      # outlives A by 30 ns: clipped to A's end
    ("E", 100, 20, 1, 1, None),     # starts as A ends: top level
    ("H", 0, 1000, 1, 2, None),     # another thread
])


def test_nesting_depth_path_and_clipping() -> None:
    before = RANGES.copy()
    nested = nest_ranges(RANGES).set_index("name")
    pd.testing.assert_frame_equal(RANGES, before)
    assert nested["path"].to_dict() == {"A": "A", "B": "A/B", "C": "A/C", "D": "A/D", "G": "A/G", "E": "E", "H": "H"}
    assert nested["depth"].to_dict() == {"A": 0, "B": 1, "C": 1, "D": 1, "G": 1, "E": 0, "H": 0}
    assert nested.loc["G", "end_clip_ns"] == 100 and nested.loc["G", "dur_ns"] == 40


def test_innermost_range_at_instants() -> None:
    nested = nest_ranges(RANGES)
    names = nested["name"].to_numpy()
    queries = [(1, 1, 0, "A"), (1, 1, 10, "B"), (1, 1, 49, "B"), (1, 1, 50, "C"), (1, 1, 60, "A"),
               (1, 1, 95, "G"), (1, 1, 100, "E"), (1, 1, 120, None), (1, 2, 5, "H"), (9, 9, 5, None),
               (1, 1, -1, None)]
    hit = enclosing_range(nested, np.array([q[0] for q in queries]), np.array([q[1] for q in queries]),
                          np.array([q[2] for q in queries]))
    assert [names[h] if h >= 0 else None for h in hit] == [q[3] for q in queries]


def test_same_start_nests_the_shorter_and_steps_number_by_start() -> None:
    ranges = _ranges([
        ("step", 200, 100, 1, 1, None), ("x", 200, 50, 1, 1, None),   # same start: x inside step
        ("step", 300, 100, 1, 1, 7),                                 # a payload wins over the ordinal
        ("step", 150, 10, 1, 2, None),                               # earliest step, another thread
        ("step", 210, 10, 1, 1, None),                               # nested step: the outer one decides
    ])
    nested = nest_ranges(ranges)
    got = sorted(zip(nested["path"], nested["ts_ns"], nested["step_id"]))
    assert got == [("step", 150, 0), ("step", 200, 1), ("step", 300, 7), ("step/x", 200, 1),
                   ("step/x/step", 210, 1)]
    # Same start and same end: the later row nests in the earlier one, and an instant finds it.
    twin = nest_ranges(_ranges([("a", 0, 10, 1, 1, None), ("b", 0, 10, 1, 1, None)]))
    assert list(twin["path"]) == ["a", "a/b"]
    assert twin["name"].to_numpy()[enclosing_range(twin, np.array([1]), np.array([1]), np.array([5]))[0]] == "b"


def test_empty_inputs() -> None:
    nested = nest_ranges(_ranges([]))
    assert nested.empty and list(enclosing_range(nested, np.array([1]), np.array([1]), np.array([1]))) == [-1]
