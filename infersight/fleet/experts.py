"""The hottest (layer, expert) pairs across the fleet, and which node carries most of each (pure).

Input `tokens` (queries.FleetQueries.expert_tokens: increase over the window):
    node, model, layer, expert   str
    tokens                       float  tokens routed to the pair on that node in the window
Output, the `top` pairs by fleet-wide tokens:
    model, layer, expert
    tokens           float  summed over nodes
    layer_share      float  the pair's share of its layer's tokens over the fleet (a uniform router
                            gives top_k / experts)
    top_node         str    the node routing the most tokens to it
    top_node_share   float  that node's share of the pair's tokens
    nodes            int    nodes that routed tokens to it
"""
from __future__ import annotations

import pandas as pd

PAIR = ["model", "layer", "expert"]
COLUMNS = [*PAIR, "tokens", "layer_share", "top_node", "top_node_share", "nodes"]


def hottest_experts(tokens: pd.DataFrame, top: int) -> pd.DataFrame:
    live = tokens[tokens["tokens"] > 0]
    if live.empty:
        return pd.DataFrame(columns=COLUMNS)
    fleet = live.groupby(PAIR, as_index=False).agg(tokens=("tokens", "sum"), nodes=("node", "nunique"))
    layer_total = fleet.groupby(["model", "layer"])["tokens"].transform("sum")
    fleet["layer_share"] = fleet["tokens"] / layer_total
    heaviest = live.sort_values(["tokens", "node"], ascending=[False, True]).drop_duplicates(PAIR)
    heaviest = heaviest[[*PAIR, "node", "tokens"]].rename(columns={"node": "top_node", "tokens": "node_tokens"})
    out = fleet.merge(heaviest, on=PAIR)
    out["top_node_share"] = out["node_tokens"] / out["tokens"]
    out = out.sort_values(["tokens", *PAIR], ascending=[False, True, True, True]).head(top)
    return out[COLUMNS].reset_index(drop=True)
