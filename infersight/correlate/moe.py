"""MoE routing load: tokens per (layer, expert) and how unevenly each layer spreads them.

Input is the `moe` frame (step_id, layer, expert, tokens), one row per (step, layer, expert); each
token routed to top_k experts counts once per expert, so a layer's total is top_k x tokens fed.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

LOAD_COLUMNS = {"layer": "int64", "expert": "int64", "tokens": "int64"}
IMBALANCE_COLUMNS = {"layer": "int64", "max_over_mean": "float64", "cv": "float64",
                     "hot_cold_ratio": "float64", "tokens": "int64"}
#: Share of a layer's experts averaged at each end for hot_cold_ratio (at least one expert).
HOT_COLD_FRACTION = 0.1


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def matrix_frame(tokens: np.ndarray) -> pd.DataFrame:
    """A cumulative [layer, expert] token matrix in this module's long moe format (step_id 0)."""
    if tokens.size == 0:
        return _empty({"step_id": "int64", "layer": "int64", "expert": "int64", "tokens": "int64"})
    layers, experts = np.indices(tokens.shape)
    return pd.DataFrame({"step_id": 0, "layer": layers.ravel(), "expert": experts.ravel(), "tokens": tokens.ravel()})


def expert_load(moe: pd.DataFrame) -> pd.DataFrame:
    """Columns layer, expert, tokens (summed over steps), sorted by layer then expert. Experts that
    never received a token keep their 0 row, so per-layer statistics see every expert."""
    if moe.empty:
        return _empty(LOAD_COLUMNS)
    load = moe.groupby(["layer", "expert"], as_index=False)["tokens"].sum()
    return load.astype(LOAD_COLUMNS).sort_values(["layer", "expert"], ignore_index=True)


def _hot_cold(sorted_tokens: np.ndarray) -> float:
    """Mean of the hottest k experts / mean of the coldest k, k = max(1, floor(10% of experts))."""
    total = sorted_tokens.sum()
    if total == 0:
        return float("nan")
    k = max(1, int(len(sorted_tokens) * HOT_COLD_FRACTION))
    cold, hot = sorted_tokens[:k].mean(), sorted_tokens[-k:].mean()
    # An expert that never fires makes the layer infinitely skewed, not undefined.
    return float("inf") if cold == 0 else float(hot / cold)


def layer_imbalance(moe: pd.DataFrame) -> pd.DataFrame:
    """One row per layer: layer, max_over_mean (hottest expert / mean expert load), cv (population
    std / mean over experts), hot_cold_ratio (mean of the hottest 10% of experts / mean of the
    coldest 10%, at least one expert each; inf when the cold mean is 0), tokens (layer total).
    A layer with no tokens at all has NaN for all three ratios (nothing to compare)."""
    load = expert_load(moe)
    if load.empty:
        return _empty(IMBALANCE_COLUMNS)
    rows = []
    for layer, grp in load.groupby("layer", sort=True):
        tokens = np.sort(grp["tokens"].to_numpy(np.int64))
        mean = tokens.mean()
        if mean == 0:
            rows.append((int(layer), np.nan, np.nan, np.nan, 0))
            continue
        rows.append((int(layer), float(tokens.max() / mean), float(tokens.std() / mean), _hot_cold(tokens),
                     int(tokens.sum())))
    return pd.DataFrame(rows, columns=list(IMBALANCE_COLUMNS)).astype(IMBALANCE_COLUMNS)


def top_pairs(moe: pd.DataFrame, n: int) -> pd.DataFrame:
    """The n hottest (layer, expert) pairs: columns layer, expert, tokens, sorted by tokens
    descending (ties: lower layer, then lower expert, first)."""
    load = expert_load(moe)
    order = load.sort_values(["tokens", "layer", "expert"], ascending=[False, True, True], kind="stable")
    return order.head(max(0, n)).reset_index(drop=True)
