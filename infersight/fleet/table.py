"""The node x model table: one row per (node, model), one column per figure, from the answers
Prometheus gave to queries.FleetQueries (pure: takes DataFrames, returns a new one).

Input `answers` (one row per series of a column's answer):
    column  str    a ColumnQuery.column
    node    str    the node label's value ("" where a series had none)
    model   str    the model label's value ("")
    value   float  what Prometheus computed (NaN: it said NaN, e.g. 0/0 over an idle window)
Input `agents` (queries.FleetQueries.agent_targets):
    node, model    as above
    instance str   the agent target's HOST:PORT (its /metrics and JSON API)

Output, sorted by node then model:
    node, model              the keys
    instance                 the agent's HOST:PORT, "" where no target scraped engine steps; several
                             agents for one (node, model) are joined with ","
    <each column name>       float, NaN where Prometheus had no data for that (node, model)
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

KEYS = ["node", "model"]


def node_table(answers: pd.DataFrame, columns: Sequence[str], agents: pd.DataFrame) -> pd.DataFrame:
    keys = pd.concat([answers[KEYS], agents[KEYS]], ignore_index=True).drop_duplicates()
    if answers.empty:
        wide = keys.copy()
    else:
        wide = answers.pivot_table(index=KEYS, columns="column", values="value", aggfunc="first", dropna=False)
        wide = keys.merge(wide.reset_index(), on=KEYS, how="left")
    instances = (agents.groupby(KEYS)["instance"].agg(lambda s: ",".join(sorted(set(s)))).reset_index()
                 if not agents.empty else pd.DataFrame(columns=[*KEYS, "instance"]))
    out = wide.merge(instances, on=KEYS, how="left")
    out["instance"] = out["instance"].fillna("")
    for column in columns:
        if column not in out:
            out[column] = float("nan")
    return out[[*KEYS, "instance", *columns]].astype({c: float for c in columns}) \
        .sort_values(KEYS).reset_index(drop=True)


def mix(frame: pd.DataFrame, part: str) -> pd.DataFrame:
    """Each (node, model)'s `part` (a slow cause, a task) as a share of its total `count`.
    Input: node, model, <part>, count. Output: the same with `share` (0..1; NaN when the total is 0)."""
    out = frame.copy()
    total = out.groupby(KEYS)["count"].transform("sum")
    out["share"] = out["count"] / total.where(total > 0)
    return out.sort_values([*KEYS, "count", part], ascending=[True, True, False, True]).reset_index(drop=True)
