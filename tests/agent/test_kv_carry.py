"""KvFold's carried open events (numpy) are what the groupby formulation gives, row for row."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infersight.agent.kv_fold import KvFold
from infersight.correlate.frames import KV_EVENT_NAMES, kv_frame
from infersight.probes.records import RecordKind, record_dtype


def _reference(window: pd.DataFrame) -> pd.DataFrame:
    """The groupby formulation: each block's last allocated/reloaded/cached event after its last close."""
    last_close = window[window["event"].isin(["evicted", "freed"])].groupby("block_id")["ts_ns"].max()
    after = window[window["ts_ns"] > window["block_id"].map(last_close).fillna(-1)]
    opens = after[after["event"].isin(["allocated", "reloaded", "cached"])]
    return opens.groupby(["block_id", "event"], sort=False).tail(1).reset_index(drop=True)


@pytest.mark.parametrize("seed", range(40))
def test_open_events_match_the_groupby(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    rec = np.zeros(n, record_dtype(RecordKind.KV_BLOCK))
    rec["ts_ns"] = np.sort(rng.integers(0, 50, n))  # ties on purpose
    rec["block_id"] = rng.integers(0, int(rng.choice([3, 20, 1000])), n)
    rec["event"] = rng.choice(sorted(KV_EVENT_NAMES), n)
    rec["request_id"] = rng.integers(-1, 10, n)
    window = kv_frame(rec)
    got, want = KvFold._open_events(window), _reference(window)
    pd.testing.assert_frame_equal(got, want, check_index_type=False)
