"""Our H200 capture: kernels -> range paths and steps (checked against the raw JSON), steps ->
requests by token share (exact integer ns), and kernel time by range name."""
from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pytest

from infersight.kernels.analysis.attribution import (
    attribute_to_requests, kernel_summary_by_request, kernel_time_by_range, largest_remainder, step_kernel_ns,
)
from infersight.kernels.analysis.categories import classify


def _ns(us: Any) -> int:
    return int(Decimal(us) * 1000)


@pytest.fixture(scope="module")
def expected(our_capture: Any) -> pd.DataFrame:
    """Per GPU activity, from the raw events only: correlation, category, dur_ns, the path of the
    CPU annotations enclosing its launch (outermost first) and the ordinal of its step."""
    events = our_capture.events
    launch = {e["args"]["correlation"]: (e["pid"], e["tid"], _ns(e["ts"])) for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    annotations = sorted(((_ns(e["ts"]), -_ns(e["dur"]), e["name"], e["pid"], e["tid"]) for e in events
                          if e.get("cat") == "user_annotation"))
    steps = [a for a in annotations if a[2] == "step"]
    rows = []
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy"):
            continue
        pid, tid, at = launch[e["args"]["correlation"]]
        around = [a for a in annotations if a[3] == pid and a[4] == tid and a[0] <= at < a[0] - a[1]]
        step = [i for i, s in enumerate(steps) if s[3] == pid and s[4] == tid and s[0] <= at < s[0] - s[1]]
        rows.append((e["args"]["correlation"], e["cat"], _ns(e["dur"]), "/".join(a[2] for a in around),
                     step[0] if step else -1))
    return pd.DataFrame(rows, columns=["correlation", "category", "dur_ns", "path", "step"])


def test_every_kernel_in_a_step_has_a_step_path(our_capture: Any, expected: pd.DataFrame) -> None:
    k = our_capture.trace.kernels
    got = k.set_index(["correlation", "category"]).sort_index()
    want = expected.set_index(["correlation", "category"]).sort_index()
    assert len(got) == len(want)
    inside = want["step"] >= 0
    assert inside.sum() > 4000  # the capture is five whole steps
    assert got.loc[inside[inside].index, "range_path"].str.match(r"^step(/|$)").all()
    assert (got["step_id"] == want["step"]).all()
    assert (got["range_path"] == want["path"]).all()  # the whole path, outermost first
    assert sorted(set(got["step_id"])) == [0, 1, 2, 3, 4]


def test_layer_attribution(our_capture: Any) -> None:
    parts = classify(our_capture.trace.kernels)
    layered = parts[parts["layer"] >= 0]
    assert sorted(set(layered["layer"])) == [0, 1, 2, 3]
    for op in ("attention", "moe.router", "moe.experts"):
        assert sorted(set(layered.loc[layered["op"] == op, "layer"])) == [0, 1, 2, 3], op
    decoded = layered["range_path"].str.extract(r"layer\.(\d+)\.")[0].astype(int)
    assert (decoded == layered["layer"]).all()
    assert set(parts["phase"]) == {"decode", "sampling"}


def _batch() -> pd.DataFrame:
    # Five captured steps numbered 0..4 (Kineto has no payloads: the ordinal of the "step" range);
    # uneven tokens so remainders matter, a step whose members fed no tokens, a step (9) that
    # was not captured; step 4 is missing from the batch.
    rows = [(0, 1, 1), (0, 2, 1), (0, 3, 1), (1, 1, 5), (1, 2, 2), (1, 4, 1), (2, 1, 0), (2, 4, 0),
            (3, 1, 7), (3, 2, 3), (3, 4, 3), (3, 5, 1), (9, 1, 4)]
    return pd.DataFrame(rows, columns=["step_id", "request_id", "num_tokens"])


def test_requests_sum_exactly_to_step_kernel_time(our_capture: Any, expected: pd.DataFrame) -> None:
    batch = _batch()
    before = (batch.copy(), our_capture.trace.kernels.copy())
    out = attribute_to_requests(our_capture.trace.kernels, batch)
    pd.testing.assert_frame_equal(batch, before[0])
    pd.testing.assert_frame_equal(our_capture.trace.kernels, before[1])
    assert list(out.columns) == ["request_id", "step_id", "kernel_ns"]
    per_step = expected[expected["step"] >= 0].groupby("step")["dur_ns"].sum()
    got = out.groupby("step_id")["kernel_ns"].sum()
    assert got.index.tolist() == [0, 1, 2, 3]
    for step in got.index:
        assert got[step] == per_step[step]
    assert step_kernel_ns(our_capture.trace.kernels).to_dict() == per_step.to_dict()
    # Shares follow tokens to within one ns; zero-token steps split evenly.
    s1 = out[out["step_id"] == 1].set_index("request_id")["kernel_ns"]
    assert abs(s1[1] - per_step[1] * 5 / 8) < 1 and abs(s1[4] - per_step[1] / 8) < 1
    s2 = out[out["step_id"] == 2]["kernel_ns"]
    assert abs(int(s2.iloc[0]) - int(s2.iloc[1])) <= 1


def test_kernel_summary_by_request(our_capture: Any) -> None:
    batch = _batch()
    summary = kernel_summary_by_request(our_capture.trace.kernels, batch, top=3)
    totals = attribute_to_requests(our_capture.trace.kernels, batch).groupby("request_id")["kernel_ns"].sum()
    assert list(summary.columns) == ["request_id", "rank", "op_category", "kernel_ns", "share", "request_kernel_ns"]
    assert sorted(set(summary["request_id"])) == sorted(totals.index)
    for rid, rows in summary.groupby("request_id"):
        assert list(rows["rank"]) == list(range(1, len(rows) + 1)) and len(rows) <= 3
        assert rows["kernel_ns"].is_monotonic_decreasing
        assert (rows["request_kernel_ns"] == totals[rid]).all()
        assert rows["kernel_ns"].sum() <= totals[rid] + 20  # a few ns of per-category rounding at most
    assert summary.iloc[0]["op_category"] == "attention-decode"


def test_kernel_time_by_range(our_capture: Any) -> None:
    trace = our_capture.trace
    by_name = kernel_time_by_range(trace.kernels, trace.ranges).set_index("name")
    total = int(trace.kernels["dur_ns"].sum())
    assert by_name.loc["step", "kernel_ns"] == total and by_name.loc["step", "count"] == 5
    assert by_name.loc["forward.decode", "kernel_ns"] + by_name.loc["sampling", "kernel_ns"] == total
    layers = by_name[by_name.index.str.match(r"^layer\.\d+\.")]
    assert len(layers) == 12 and (layers["count"] == 5).all()
    assert layers["kernel_ns"].sum() <= by_name.loc["forward.decode", "kernel_ns"]


def test_largest_remainder() -> None:
    # 10 ns by 3:1 -> 7.5, 2.5 -> 8, 2 (tie broken by row order); 7 ns in thirds -> 3, 2, 2.
    got = largest_remainder(np.array([10, 10, 7, 7, 7, 100]), np.array([3, 1, 1, 1, 1, 5]),
                            np.array([1, 1, 2, 2, 2, 3]))
    assert got.tolist() == [8, 2, 3, 2, 2, 100]
    assert largest_remainder(np.array([3, 3]), np.array([0, 0]), np.array([6, 6])).tolist() == [2, 1]
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 50, 2000)
    totals = rng.integers(0, 10**9, 50)[groups]
    weights = rng.integers(0, 100, 2000)
    split = largest_remainder(totals, weights, groups)
    per_group = pd.Series(split).groupby(groups).sum()
    assert (per_group.to_numpy() == pd.Series(totals).groupby(groups).first().to_numpy()).all()
    assert re.match(r"^int", str(split.dtype))


def test_capture_steps_join_the_engines_batch_rows_by_first_step(our_capture):
    """A torch.profiler capture numbers its steps 0..4; the engine knew them as 100..104."""
    from infersight.kernels.analysis.attribution import request_kernel_summaries

    kernels = our_capture.trace.kernels
    gpu = kernels[kernels["category"].isin(["kernel", "gpu_memcpy", "gpu_memset"]) & (kernels["step_id"] >= 0)]
    per_step = gpu.groupby("step_id")["dur_ns"].sum()
    steps = sorted(per_step.index)
    # Two requests in every step, 3 and 1 tokens: request 7 gets ~3/4 of each step's kernel time.
    batch = pd.DataFrame({"step_id": [100 + s for s in steps for _ in (0, 1)],
                          "request_id": [7, 8] * len(steps), "num_tokens": [3, 1] * len(steps)})
    got = request_kernel_summaries(kernels, batch, first_step=100)
    assert set(got) == {7, 8}
    assert got[7]["kernel_ns"] + got[8]["kernel_ns"] == int(per_step.sum())  # exact: largest remainder
    assert abs(got[7]["kernel_ns"] - 0.75 * per_step.sum()) <= len(steps)
    assert got[7]["top"] and 0 < sum(t["share"] for t in got[7]["top"]) <= 1 + 1e-9  # the top 3 of its time
    # With the wrong offset no batch row matches a captured step: nothing is attributed.
    assert request_kernel_summaries(kernels, batch, first_step=0) == {}
