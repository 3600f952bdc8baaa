"""Prefix-cache effectiveness: how many prompt tokens were served from cached KV, overall and
per prefix group (requests whose first full block is the same, e.g. a shared system prompt).

Input is the `prefix` frame (ts_ns, request_id, task, prompt_tokens, cached_tokens, group_hash),
one row per request, written when it is first scheduled.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

GROUP_COLUMNS = {"group_hash": "uint64", "requests": "int64", "cached_tokens": "int64", "hit_rate": "float64"}


def prefix_hit_rates(prefix: pd.DataFrame) -> dict[str, float]:
    """token_hit_rate = sum cached_tokens / sum prompt_tokens; request_hit_rate = share of requests
    with cached_tokens > 0; plus requests, prompt_tokens, cached_tokens (as floats). Rates are 0.0
    for an empty frame (no traffic is reported as no hits rather than NaN)."""
    prompt = int(prefix["prompt_tokens"].sum())
    cached = int(prefix["cached_tokens"].sum())
    n = len(prefix)
    return {
        "token_hit_rate": cached / prompt if prompt else 0.0,
        "request_hit_rate": float((prefix["cached_tokens"] > 0).sum()) / n if n else 0.0,
        "requests": float(n), "prompt_tokens": float(prompt), "cached_tokens": float(cached),
    }


def top_prefix_groups(prefix: pd.DataFrame, n: int) -> pd.DataFrame:
    """The n largest prefix groups: columns group_hash, requests, cached_tokens, hit_rate (the
    group's cached / prompt tokens), sorted by requests then cached_tokens, descending (ties:
    smaller group_hash first). group_hash 0 (prompt shorter than one block: no group) is excluded."""
    grouped = prefix[prefix["group_hash"] != 0]
    if grouped.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in GROUP_COLUMNS.items()})
    agg = grouped.groupby("group_hash", as_index=False).agg(
        requests=("request_id", "size"), cached_tokens=("cached_tokens", "sum"),
        prompt_tokens=("prompt_tokens", "sum"))
    prompt = agg["prompt_tokens"].to_numpy(np.float64)
    agg["hit_rate"] = np.divide(agg["cached_tokens"].to_numpy(np.float64), prompt,
                                out=np.zeros(len(agg)), where=prompt > 0)
    agg = agg.sort_values(["requests", "cached_tokens", "group_hash"], ascending=[False, False, True],
                          kind="stable")
    return agg[list(GROUP_COLUMNS)].head(max(0, n)).astype(GROUP_COLUMNS).reset_index(drop=True)
