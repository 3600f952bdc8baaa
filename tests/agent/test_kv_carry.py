"""KvFold's carried open events (numpy) are what the groupby formulation gives, row for row, poll by
poll; the carry and the held reloads stay within KvLimits, the rest counted."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infersight.agent.folds.kv import KvFold, KvLimits
from infersight.correlate import kv
from infersight.correlate.frames import KV_EVENT_NAMES, kv_frame
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import LabelledCounter, LabelledHistogram
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


def _random_batches(seed: int, polls: int) -> list[pd.DataFrame]:
    """KV event batches of a random engine-like stream over a few blocks (ties and closes on purpose)."""
    rng = np.random.default_rng(seed)
    out, t = [], 0
    for _ in range(polls):
        n = int(rng.integers(0, 60))
        rec = np.zeros(n, record_dtype(RecordKind.KV_BLOCK))
        rec["ts_ns"] = t + np.sort(rng.integers(0, 40, n))
        t += 40
        rec["block_id"] = rng.integers(0, int(rng.choice([4, 30, 300])), n)
        rec["event"] = rng.choice(sorted(KV_EVENT_NAMES), n)
        rec["request_id"] = rng.integers(-1, 10, n)
        out.append(kv_frame(rec))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_the_fold_over_polls_is_the_whole_window_formulation(seed: int) -> None:
    """Carry and ages poll by poll equal the plain formulation: carry = groupby-open-events of
    (carry + batch), ages = block_lifetimes of (carry + batch), though the fold only revisits the
    carried blocks a batch touches."""
    fold = KvFold(_counters(), _histograms())
    ref_carry = kv_frame(np.zeros(0, record_dtype(RecordKind.KV_BLOCK)))
    ref_hist = _histograms()[C.KV_AGE.name]
    for batch in _random_batches(seed, 25):
        if batch.empty:
            continue
        window = pd.concat([ref_carry, batch], ignore_index=True) if not ref_carry.empty else batch
        ages = kv.block_lifetimes(window)
        for age_kind in sorted(set(ages["kind"])):
            ref_hist.observe((age_kind,), ages.loc[ages["kind"] == age_kind, "seconds"].to_numpy())
        ref_carry = _reference(window)
        fold.fold(batch, 16)
        pd.testing.assert_frame_equal(fold.carry, ref_carry, check_index_type=False)
    got = fold.histograms[C.KV_AGE.name].series
    assert got.keys() == ref_hist.series.keys()
    for labels, series in ref_hist.series.items():
        assert got[labels].counts.tolist() == series.counts.tolist() and got[labels].sum == series.sum


def _counters() -> dict[str, LabelledCounter]:
    return {spec.name: LabelledCounter() for spec in C.CATALOGUE if spec.kind == "counter"}


def _histograms() -> dict[str, LabelledHistogram]:
    return {spec.name: LabelledHistogram(spec.buckets or ()) for spec in C.CATALOGUE if spec.kind == "histogram"}


def _events(rows: list[tuple[int, str, int, int]]) -> pd.DataFrame:
    rec = np.zeros(len(rows), record_dtype(RecordKind.KV_BLOCK))
    names = {name: code for code, name in KV_EVENT_NAMES.items()}
    for i, (ts, event, block, request) in enumerate(rows):
        rec[i]["ts_ns"], rec[i]["event"], rec[i]["block_id"], rec[i]["request_id"] = ts, names[event], block, request
    return kv_frame(rec)


def test_open_events_and_reloads_are_bounded_and_the_drops_counted() -> None:
    """Blocks cached and never evicted, reloads of requests that never finish: the carry keeps the
    newest max_open_events rows, the reloads the newest max_reloads; the rest are counted."""
    limits = KvLimits(max_open_events=100, max_reloads=10)
    fold = KvFold(_counters(), _histograms(), limits)
    dropped = fold.counters[C.KV_TRACKING_DROPPED.name]
    assert dropped.values == {("open_events",): 0, ("reloads",): 0}  # present before any drop
    cached = [(i, "cached", i, -1) for i in range(1000)]  # 1000 blocks, one open event each
    reloads = [(1000 + i, "reloaded", 5000 + i, i) for i in range(50)]  # 50 requests in flight, a block each
    emitted = []
    for start in range(0, 1000, 100):
        batch = cached[start:start + 100] + reloads[start // 20:(start + 100) // 20]
        emitted += batch
        fold.fold(_events(batch), 16)
    # Every row opened its own block: the newest 100 in emission order are kept.
    assert fold.carry["block_id"].tolist() == [block for _, _, block, _ in emitted[-100:]]
    assert fold.reload_events["request_id"].tolist() == list(range(40, 50))
    assert dropped.values == {("open_events",): len(emitted) - 100, ("reloads",): len(reloads) - 10}
    # The kept blocks still age: an eviction of one is an idle_before_evict.
    fold.fold(_events([(2000, "evicted", 999, -1), (2000, "evicted", 3, -1)]), 16)
    assert fold.histograms[C.KV_AGE.name].series[("idle_before_evict",)].count == 1
