"""The ingest's shortcuts against what they replace: each must give the same values, in the same order.

- SlowJudge's flagged rows by lookup = the merge it replaced;
- the ledger's per-task finish reason counts = pd.Series.value_counts (order included: the counter
  series are created in that order);
- acceptance_by_position = a per-row count in plain Python.
"""
from __future__ import annotations

import random

import numpy as np
import pandas as pd

from infersight.agent.folds.request_ledger import _value_counts
from infersight.agent.slow.judge import _flagged
from infersight.correlate import speculation


def test_flagged_rows_equal_the_merge() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        ids = rng.permutation(500)[:n].astype(np.int64)
        features = pd.DataFrame({"request_id": ids, "e2e_s": rng.random(n), "task": pd.Series(["t"] * n, dtype=object)})
        order = rng.permutation(n)
        verdicts = pd.DataFrame({"request_id": ids[order], "slow": rng.random(n) < 0.3,
                                 "metric": pd.Series(rng.choice(["e2e", "ttft"], n), dtype=object),
                                 "value_s": rng.random(n), "threshold_s": np.where(rng.random(n) < .3, np.nan, 1.0)})
        want = features.merge(verdicts.loc[verdicts["slow"], ["request_id", "metric", "threshold_s"]], on="request_id")
        pd.testing.assert_frame_equal(_flagged(features, verdicts), want)


def test_value_counts_equal_pandas_in_order() -> None:
    rng = random.Random(1)
    for _ in range(500):
        pool = rng.choice([["length", "stop", "abort", ""], ["a", None, float("nan"), "b", "c"]])
        values = np.empty(rng.randint(0, 30), dtype=object)
        values[:] = [rng.choice(pool) for _ in range(len(values))]
        want = [(k, int(v)) for k, v in pd.Series(values).value_counts().items()]
        assert _value_counts(values.tolist()) == want


def test_acceptance_by_position_equals_a_per_row_count() -> None:
    rng = random.Random(2)
    for _ in range(100):
        n = rng.randint(1, 60)
        proposed = [rng.randint(0, 6) for _ in range(n)]
        masks = [rng.getrandbits(p) if p else 0 for p in proposed]
        tasks = [rng.choice(["x", "y", "z"]) for _ in range(n)]
        spec = pd.DataFrame({"ts_ns": range(n), "request_id": range(n), "task": pd.Series(tasks, dtype=object),
                             "proposed": proposed, "accepted": 0, "accept_mask": np.array(masks, np.uint64),
                             "draft_ns": 0, "verify_ns": 0})
        want = []
        for task in sorted(set(tasks)):
            mine = [(p, m) for p, m, t in zip(proposed, masks, tasks) if t == task]
            for pos in range(max(p for p, _ in mine)):
                checked = sum(1 for p, _ in mine if p > pos)
                kept = sum(1 for p, m in mine if p > pos and m >> pos & 1)
                want.append((task, pos, checked, kept, kept / checked))
        got = speculation.acceptance_by_position(spec)
        assert [tuple(r) for r in got.itertuples(index=False)] == want
        assert got.dtypes.astype(str).tolist() == ["object", "int64", "int64", "int64", "float64"]
