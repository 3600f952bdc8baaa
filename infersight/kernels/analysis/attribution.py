"""Kernel time -> steps -> requests, and kernel time by enclosing range name.

"Kernel time" here is all GPU activity in the kernels frame (kernels, copies, memsets): a
request pays for the copies its step made too. Steps are the kernels' step_id (see frames.py):
with the nvtx package the engine's own step id, otherwise the ordinal of the "step" range, so a
`batch` frame for a Kineto capture numbers the captured steps 0, 1, 2, ...

batch (infersight.correlate.frames): step_id, request_id, num_tokens (tokens the request fed).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.kernels.analysis.categories import classify
from infersight.kernels.frames import empty_frame
from infersight.kernels.analysis.paths import path_components

REQUEST_COLUMNS = {"request_id": "int64", "step_id": "int64", "kernel_ns": "int64"}
SUMMARY_COLUMNS = {"request_id": "int64", "rank": "int64", "op_category": "object", "kernel_ns": "int64",
                   "share": "float64", "request_kernel_ns": "int64"}
RANGE_TIME_COLUMNS = {"name": "object", "count": "int64", "kernel_ns": "int64", "share": "float64"}


def largest_remainder(total: np.ndarray, weight: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Integer shares of each group's total, proportional to weight, summing exactly to it.

    total: the group's total, repeated on each of its rows; weight >= 0 (a group whose weights
    are all 0 is split evenly); group: a group code per row. Floors first; then the rows with the
    largest remainders get one more each (ties: row order)."""
    total = np.asarray(total, np.int64)
    weight = np.asarray(weight, np.int64)
    group = np.asarray(group)
    if len(total) == 0:
        return np.zeros(0, dtype=np.int64)
    by_group = pd.Series(weight).groupby(group)
    wsum = by_group.transform("sum").to_numpy(np.int64)
    size = by_group.transform("size").to_numpy(np.int64)
    weight = np.where(wsum > 0, weight, 1)
    denom = np.where(wsum > 0, wsum, size)
    base, rem = np.divmod(total * weight, denom)
    short = total - pd.Series(base).groupby(group).transform("sum").to_numpy(np.int64)
    order = np.lexsort((np.arange(len(rem)), -rem, group))
    codes = pd.factorize(group[order])[0]
    first = np.r_[0, np.flatnonzero(np.diff(codes)) + 1]
    rank = np.empty(len(rem), dtype=np.int64)
    rank[order] = np.arange(len(rem)) - np.repeat(first, np.diff(np.r_[first, len(rem)]))
    return base + (rank < short)


def step_kernel_ns(kernels: pd.DataFrame) -> pd.Series:
    """Kernel time per step (index step_id, int64), for kernels inside a step."""
    inside = kernels[kernels["step_id"] >= 0]
    return inside.groupby("step_id")["dur_ns"].sum().astype(np.int64)


def _split(per_step: pd.DataFrame, batch: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """per_step: keys (step_id first) + kernel_ns. Each row's ns split over the step's batch rows by
    num_tokens. Returns batch columns + the extra keys + kernel_ns (the split)."""
    members = batch[["step_id", "request_id", "num_tokens"]].reset_index(drop=True)
    members = members.assign(_order=np.arange(len(members)))
    df = members.merge(per_step, on="step_id", how="inner").sort_values(keys + ["_order"], kind="stable")
    group = pd.factorize(pd.MultiIndex.from_frame(df[keys]))[0] if len(df) else np.zeros(0, np.int64)
    ns = largest_remainder(df["kernel_ns"].to_numpy(np.int64), df["num_tokens"].to_numpy(np.int64), group)
    return df.drop(columns=["kernel_ns", "_order"]).assign(kernel_ns=ns).reset_index(drop=True)


def attribute_to_requests(kernels: pd.DataFrame, batch: pd.DataFrame) -> pd.DataFrame:
    """request_id, step_id, kernel_ns: each step's kernel time split over its batch by token share.

    Integer ns by largest remainder: for every step present in both frames, its rows sum exactly
    to step_kernel_ns(kernels)[step]. Steps with kernels but no batch rows, and batch rows of steps
    without kernels, are left out. Rows are by step_id, then batch order."""
    per_step = step_kernel_ns(kernels).rename("kernel_ns").reset_index()
    if per_step.empty or batch.empty:
        return empty_frame(REQUEST_COLUMNS)
    out = _split(per_step, batch, ["step_id"])
    return out[list(REQUEST_COLUMNS)].astype(REQUEST_COLUMNS)


def kernel_summary_by_request(kernels: pd.DataFrame, batch: pd.DataFrame, top: int = 3) -> pd.DataFrame:
    """The top categories of each request's kernel time, long format, ready to attach to its trace.

    Columns: request_id, rank (1 = most time), op_category (categories.py), kernel_ns (the
    request's token share of that category's time in each of its steps, summed), share
    (kernel_ns / request_kernel_ns), request_kernel_ns (the request's total, as from
    attribute_to_requests). Categories are split per (step, category), so a request's category
    times may differ from its total by a few ns of rounding. `kernels` may already be classified."""
    if batch.empty or kernels.empty:
        return empty_frame(SUMMARY_COLUMNS)
    k = kernels if "op_category" in kernels.columns else classify(kernels)
    k = k[k["step_id"] >= 0]
    per = k.groupby(["step_id", "op_category"], as_index=False)["dur_ns"].sum().rename(columns={"dur_ns": "kernel_ns"})
    if per.empty:
        return empty_frame(SUMMARY_COLUMNS)
    split = _split(per, batch, ["step_id", "op_category"])
    by_cat = split.groupby(["request_id", "op_category"], as_index=False)["kernel_ns"].sum()
    totals = attribute_to_requests(k, batch).groupby("request_id")["kernel_ns"].sum()
    by_cat = by_cat.sort_values(["request_id", "kernel_ns", "op_category"], ascending=[True, False, True])
    by_cat = by_cat.assign(rank=by_cat.groupby("request_id").cumcount() + 1)
    by_cat = by_cat[by_cat["rank"] <= top]
    req_total = by_cat["request_id"].map(totals).fillna(0).astype(np.int64)
    share = np.where(req_total > 0, by_cat["kernel_ns"] / req_total.where(req_total > 0, 1), 0.0)
    out = by_cat.assign(request_kernel_ns=req_total, share=share)
    return out[list(SUMMARY_COLUMNS)].astype(SUMMARY_COLUMNS).reset_index(drop=True)


def kernel_time_by_range(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """name, count, kernel_ns, share: GPU time inside ranges of each name, sorted by kernel_ns.

    A kernel counts once for every distinct name on its range_path (so "step" holds everything
    in steps, and a name nested in itself is not counted twice). count: ranges of that name in
    `ranges`, of kind cpu when the capture has any (Kineto also lists GPU-side copies), else gpu.
    share: kernel_ns / all GPU time in `kernels`."""
    total = int(kernels["dur_ns"].sum())
    per_path = kernels.groupby("range_path", sort=False)["dur_ns"].sum()
    per_path = per_path[per_path.index != ""]
    if per_path.empty:
        return empty_frame(RANGE_TIME_COLUMNS)
    comps = path_components(pd.Series(per_path.index, dtype=object))
    comps = comps.assign(kernel_ns=per_path.to_numpy(np.int64)[comps["row"].to_numpy()])
    by_name = comps.groupby("name", sort=False)["kernel_ns"].sum()
    kind = "cpu" if (ranges["kind"] == "cpu").any() else "gpu"
    counts = ranges[ranges["kind"] == kind]["name"].value_counts()
    out = pd.DataFrame({"name": by_name.index.to_numpy(object), "kernel_ns": by_name.to_numpy(np.int64)})
    out = out.assign(count=out["name"].map(counts).fillna(0).astype(np.int64),
                     share=out["kernel_ns"] / total if total else 0.0)
    out = out.sort_values(["kernel_ns", "name"], ascending=[False, True], kind="stable")
    return out[list(RANGE_TIME_COLUMNS)].astype(RANGE_TIME_COLUMNS).reset_index(drop=True)


def request_kernel_summaries(kernels: pd.DataFrame, batch: pd.DataFrame, first_step: int,
                             top: int = 3) -> dict[int, dict[str, object]]:
    """Per request of a capture: {"kernel_ns", "top": [{"category", "kernel_ns", "share"}]}.

    A torch.profiler capture numbers its steps 0..N-1 (step_id); the engine's id of captured step
    k is first_step + k, which is how `batch` (the engine's batch rows) is keyed."""
    gpu = kernels[kernels["category"].isin(["kernel", "gpu_memcpy", "gpu_memset"])]
    shifted = gpu.assign(step_id=np.where(gpu["step_id"] >= 0, gpu["step_id"] + first_step, -1))
    summary = kernel_summary_by_request(shifted, batch, top)
    out: dict[int, dict[str, object]] = {}
    for rid, g in summary.groupby("request_id", sort=True):
        out[int(rid)] = {"kernel_ns": int(g["request_kernel_ns"].iloc[0]),
                         "top": [{"category": str(r.op_category), "kernel_ns": int(r.kernel_ns),
                                  "share": float(r.share)} for r in g.sort_values("rank").itertuples(index=False)]}
    return out
