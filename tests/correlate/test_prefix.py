"""prefix_hit_rates / top_prefix_groups on a hand-built prefix frame."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infersight.correlate.frames import PREFIX_COLUMNS
from infersight.correlate.prefix import prefix_hit_rates, top_prefix_groups

A, B, C = 2**63 + 5, 17, 2**40   # group hashes (uint64; A is above int64's range)

PREFIX = pd.DataFrame({
    "ts_ns": range(8), "request_id": range(1, 9), "task": ["chat"] * 8,
    "prompt_tokens": [40, 40, 50, 20, 10, 30, 30, 20],
    "cached_tokens": [32, 0, 32, 16, 0, 0, 0, 16],
    "group_hash": np.array([A, A, A, B, 0, C, C, B], dtype=np.uint64),
}).astype(PREFIX_COLUMNS)


def test_prefix_hit_rates() -> None:
    # prompt 40+40+50+20+10+30+30+20 = 240; cached 32+32+16+16 = 96 -> 0.4; 4 of 8 requests hit.
    assert prefix_hit_rates(PREFIX) == pytest.approx({"token_hit_rate": 0.4, "request_hit_rate": 0.5,
                                                      "requests": 8.0, "prompt_tokens": 240.0, "cached_tokens": 96.0})
    assert prefix_hit_rates(PREFIX.iloc[:0]) == {"token_hit_rate": 0.0, "request_hit_rate": 0.0, "requests": 0.0,
                                                 "prompt_tokens": 0.0, "cached_tokens": 0.0}


def test_top_prefix_groups() -> None:
    top = top_prefix_groups(PREFIX, 5)
    assert list(top.columns) == ["group_hash", "requests", "cached_tokens", "hit_rate"]
    # A: 3 requests, cached 64 of 130; B: 2, 32 of 40; C: 2, 0 of 60 (B before C: more cached).
    # Group 0 (prompt shorter than a block) is excluded.
    assert [int(h) for h in top.group_hash] == [A, B, C]
    assert list(top.requests) == [3, 2, 2]
    assert list(top.cached_tokens) == [64, 32, 0]
    assert list(top.hit_rate) == pytest.approx([64 / 130, 0.8, 0.0])
    assert len(top_prefix_groups(PREFIX, 1)) == 1
    empty = top_prefix_groups(PREFIX[PREFIX.group_hash == 0], 3)
    assert empty.empty and list(empty.columns) == ["group_hash", "requests", "cached_tokens", "hit_rate"]
