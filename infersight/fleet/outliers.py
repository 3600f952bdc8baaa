"""Outlier nodes: for each column, each node is compared with the other nodes serving the same
model by a robust statistic, the modified z-score (Iglewicz and Hoaglin):

    z = direction * (x - median(others)) / scale,   scale = max(1.4826 * MAD(others), 0.1 * |median(others)|, 1e-12)
    (for a quantile column, x - median is the smallest difference the histogram's buckets allow; below)

- median and MAD (median absolute deviation) of the *other* nodes (leave-one-out): in a small fleet
  the slow node would otherwise widen the very spread it is judged against (with three nodes, by
  half). 1.4826 * MAD estimates a standard deviation under normal noise.
- The scale's floor, 10% of the median, keeps near-identical nodes (MAD ~ 0) from flagging noise: a
  node must be worse than its peers by more than 3.5 x 10% of their median. Where the peers' median
  is 0 (no preemptions anywhere else), any amount on one node stands out, which is the point.
- A quantile column (TTFT, ITL, e2e p50 and p99) is histogram_quantile over a histogram's buckets, which
  interpolates linearly inside the bucket holding the quantile: a reading says only that the true
  quantile lies in that bucket, (lower, upper]. Where it sits inside depends on the shape of the
  latencies there, so two nodes with the same latencies near a bound can read a bucket apart (ITL p50s of
  9.9 and 14.4 ms, true values on either side of the 10 ms bound, e2e p50s equal). So a quantile is judged
  on the smallest difference its buckets allow: the node's bucket's lower bound less the upper bound of
  its peers' median (the median of their buckets' upper bounds; the true median lies below it), when the
  node reads above its peers; zero when the two intervals overlap or touch. So a node is flagged on a
  quantile only when a whole bucket lies between its bucket and its peers', and that gap is over 3.5
  scales. The bounds are each node's own, as its series hold them (`le`): an agent serving a
  vLLM's histograms keeps vLLM's buckets.
- direction: +1 where higher is worse (latency, queueing, preemptions), -1 where lower is (hit and
  acceptance rates). A node is flagged on a column when z > 3.5 (Iglewicz and Hoaglin's cut).

- A share of requests (slow_share: k of the node's n requests in the window) is also judged against
  its own sampling noise: the scale is at least the binomial standard error sqrt(p (1 - p) / n) at
  the peers' median p, and p at least 1/n (one request's worth). Each agent flags requests above its
  own rolling p99, so every node flags a few by chance: without this floor, one flagged request on a
  node whose peers flagged none in the window would stand out infinitely (a median and MAD of 0).

A (node, model) is an outlier when it is flagged on a symptom (a latency quantile or its share of
slow requests). Its cause is the flagged cause column with the largest z (a preemption rate that
stands out names "preemption"); without one, the largest share of its slow-cause mix (the agent's
own attribution, slow_requests by cause); without that, "unexplained".
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import pandas as pd

from infersight.fleet.queries import QUANTILE_COLUMNS
from infersight.fleet.table import KEYS

Z_CUT = 3.5
MAD_TO_SIGMA = 1.4826
RELATIVE_FLOOR = 0.1

#: Symptom columns: what a slow node shows. +1: higher is worse.
SYMPTOMS: dict[str, int] = {"ttft_p50_s": 1, "ttft_p99_s": 1, "itl_p50_s": 1, "itl_p99_s": 1, "e2e_p50_s": 1,
                            "e2e_p99_s": 1, "slow_share": 1}
#: Cause columns: why it is slow, and the cause each names (the slow-cause names where one fits:
#: exporters.catalogue.SLOW_CAUSES).
CAUSES: dict[str, tuple[int, str]] = {
    "preemptions_per_request": (1, "preemption"),
    "queue_share": (1, "queue_wait"),
    "kv_usage_ratio": (1, "kv_pressure"),
    "prefix_hit_rate": (-1, "prefix_cache_misses"),
    "spec_accept_rate": (-1, "speculation_rejections"),
    "probe_events_dropped": (1, "dropped_probe_events"),
    "energy_per_output_token_j": (1, "energy"),
}


def bucket_of(bounds: Sequence[float], value: float) -> tuple[float, float]:
    """The histogram bucket (lower, upper] that holds a histogram_quantile reading `value`, given the
    histogram's finite `le` bounds, ascending: upper is the first bound >= value, the first bucket's lower
    bound is 0; above the last bound, (last, inf) (histogram_quantile reads the +Inf bucket as the last
    bound, which lands in the last finite bucket: the conservative side)."""
    i = bisect.bisect_left(bounds, value)
    if i == len(bounds):
        return (bounds[-1] if bounds else 0.0), math.inf
    return (bounds[i - 1] if i > 0 else 0.0), bounds[i]


def resolved_difference(own: tuple[float, float], peers: Sequence[tuple[float, float]]) -> float:
    """The smallest difference between a node's quantile and its peers' median that their buckets allow
    (module docstring): own and peers are buckets (lower, upper]. The peers' median lies between the
    median of their lower bounds and the median of their upper bounds. Positive: the node above."""
    low = float(pd.Series([b[0] for b in peers]).median())
    high = float(pd.Series([b[1] for b in peers]).median())
    if own[0] >= high:
        return own[0] - high
    if own[1] <= low:
        return own[1] - low
    return 0.0


#: Shares of the node's finished requests (the `requests` column counts them): judged against their
#: binomial sampling noise too (module docstring).
REQUEST_SHARES = ("slow_share",)


def direction(column: str) -> int:
    return SYMPTOMS.get(column) or CAUSES[column][0]


def scores(table: pd.DataFrame, buckets: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (node, model, judged column) with a value and at least one peer:
    node, model, column; value; peers (how many other nodes); peer_median, peer_mad, scale; difference
    (value - peer_median; for a quantile column the smallest difference its buckets allow); z
    (direction * difference / scale: positive is worse); flagged (z > Z_CUT).
    Inputs: table.node_table's frame; buckets: node, model, column, le (a quantile column's histogram
    bounds per node, +Inf left out or kept), where a (node, model, column) without rows has the
    catalogue's bounds (what infersight's own agents write); None: the catalogue's for every node."""
    given: dict[tuple[str, str, str], tuple[float, ...]] = {}
    if buckets is not None and not buckets.empty:
        finite = buckets[buckets["le"] < math.inf]
        for (node, model, column), group in finite.groupby([*KEYS, "column"]):
            given[(node, model, column)] = tuple(sorted(set(group["le"].astype(float))))
    rows = []
    for column in [c for c in [*SYMPTOMS, *CAUSES] if c in table]:
        sign = direction(column)
        spec = QUANTILE_COLUMNS[column][0] if column in QUANTILE_COLUMNS else None
        for _model, group in table.groupby("model"):
            values = group[["node", "model", column]].dropna()
            counted = group["requests"] if column in REQUEST_SHARES and "requests" in group else None
            bucket = ({i: bucket_of(given.get((r["node"], r["model"], column), spec.buckets or ()), float(r[column]))
                       for i, r in values.iterrows()} if spec is not None else {})
            for i, row in values.iterrows():
                peers = values.loc[values.index != i, column]
                if peers.empty:
                    continue
                med = float(peers.median())
                mad = float((peers - med).abs().median())
                scale = max(MAD_TO_SIGMA * mad, RELATIVE_FLOOR * abs(med), 1e-12)
                if counted is not None and counted[i] >= 1:
                    p = min(max(med, 1.0 / counted[i]), 1.0)
                    scale = max(scale, math.sqrt(p * (1.0 - p) / counted[i]))
                difference = (resolved_difference(bucket[i], [bucket[j] for j in peers.index])
                              if spec is not None else float(row[column]) - med)
                z = sign * difference / scale
                rows.append({"node": row["node"], "model": row["model"], "column": column,
                             "value": float(row[column]), "peers": len(peers), "peer_median": med, "peer_mad": mad,
                             "scale": scale, "difference": difference, "z": z, "flagged": z > Z_CUT})
    cols = [*KEYS, "column", "value", "peers", "peer_median", "peer_mad", "scale", "difference", "z", "flagged"]
    return pd.DataFrame(rows, columns=cols)


def outliers(judged: pd.DataFrame, slow_mix: pd.DataFrame) -> pd.DataFrame:
    """One row per outlier (node, model), the worst first:
    node, model; score (its largest symptom z); symptoms (flagged symptom columns, worst first);
    causes (flagged cause columns, worst first); cause (see the module docstring); cause_from
    ("cause column <name>", "slow-cause mix" or ""); top_slow_cause and top_slow_cause_share (its
    mix's largest, "" and NaN without slow requests).
    Inputs: scores()'s frame and table.mix(slow causes, "cause")."""
    rows = []
    for (node, model), group in judged[judged["flagged"]].groupby(KEYS):
        symptoms = group[group["column"].isin(SYMPTOMS)].sort_values("z", ascending=False)
        if symptoms.empty:
            continue
        causes = group[group["column"].isin(CAUSES)].sort_values("z", ascending=False)
        own = slow_mix[(slow_mix["node"] == node) & (slow_mix["model"] == model) & (slow_mix["count"] > 0)]
        own = own.sort_values(["count", "cause"], ascending=[False, True])
        top, share = (str(own["cause"].iloc[0]), float(own["share"].iloc[0])) if not own.empty else ("", math.nan)
        if not causes.empty:
            cause, source = CAUSES[causes["column"].iloc[0]][1], f"cause column {causes['column'].iloc[0]}"
        elif top:
            cause, source = top, "slow-cause mix"
        else:
            cause, source = "unexplained", ""
        rows.append({"node": node, "model": model, "score": float(symptoms["z"].iloc[0]),
                     "symptoms": list(symptoms["column"]), "causes": list(causes["column"]), "cause": cause,
                     "cause_from": source, "top_slow_cause": top, "top_slow_cause_share": share})
    cols = [*KEYS, "score", "symptoms", "causes", "cause", "cause_from", "top_slow_cause", "top_slow_cause_share"]
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values("score", ascending=False).reset_index(drop=True)
