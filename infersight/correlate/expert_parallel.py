"""Expert-parallel analyses: how much of the MoE layer time is all-to-all, which rank is hot or
straggles, and an EPLB-style replication plan with its predicted balance.

Input is the `ep` frame of correlate/frames.py (one row per (step, MoE layer, rank), from every
rank's ring, concatenated): step_id, layer, rank, world, chunk, dispatch_ns, compute_ns,
combine_ns, gather_ns, total_ns, bytes_to_peer, expert_ids, expert_tokens. Rows of chunk > 0 only
continue the tuples (peer chunk*8, slot chunk*24 onwards); timings are read from chunk 0. Every
function is pure: it never mutates its inputs. Durations in outputs are seconds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from infersight.probes.records import EP_EXPERTS_PER_RECORD, EP_PEERS_PER_RECORD

PEER_BYTES_COLUMNS = {"step_id": "int64", "layer": "int64", "rank": "int64", "peer": "int64", "bytes": "int64"}
EXPERT_TOKEN_COLUMNS = {"step_id": "int64", "layer": "int64", "rank": "int64", "slot": "int64", "expert": "int64",
                        "tokens": "int64"}
LOAD_COLUMNS = {"layer": "int64", "expert": "int64", "tokens": "int64"}
SHARE_COLUMNS = {"dispatch_s": "float64", "compute_s": "float64", "combine_s": "float64", "gather_s": "float64",
                 "moe_s": "float64", "a2a_share": "float64", "comm_share": "float64"}
RANK_LOAD_COLUMNS = {"layer": "int64", "rank": "int64", "tokens": "int64", "load_over_mean": "float64"}
STRAGGLER_COLUMNS = {"step_id": "int64", "straggler": "int64", "max_compute_ns": "int64",
                     "mean_compute_ns": "float64", "skew": "float64"}
HOT_RANK_COLUMNS = {"rank": "int64", "tokens": "int64", "load_over_mean": "float64", "compute_s": "float64",
                    "straggler_steps": "int64", "straggler_share": "float64", "hot": "bool"}
PLAN_COLUMNS = {"layer": "int64", "world": "int64", "n_experts": "int64", "replicas_added": "int64",
                "balance_before": "float64", "balance_after": "float64", "replicas": "object"}
#: A rank whose token load is at least this many times the mean rank load is hot.
HOT_RANK_THRESHOLD = 1.2


def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def _timings(ep: pd.DataFrame) -> pd.DataFrame:
    return ep[ep["chunk"] == 0]


def _explode(ep: pd.DataFrame, column: str, width: int) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """(key columns repeated per tuple element, position of each element, the elements)."""
    lengths = ep[column].map(len).to_numpy(np.int64)
    rows = np.repeat(np.arange(len(ep)), lengths)
    within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    position = ep["chunk"].to_numpy(np.int64)[rows] * width + within
    values = np.fromiter((v for t in ep[column] for v in t), dtype=np.int64, count=int(lengths.sum()))
    keys = ep[["step_id", "layer", "rank"]].iloc[rows].reset_index(drop=True)
    return keys, position, values


def peer_bytes(ep: pd.DataFrame) -> pd.DataFrame:
    """Long format: step_id, layer, rank, peer, bytes (activation bytes `rank` dispatched to `peer`;
    peer == rank is a local copy; in combine `peer` sends as many bytes back)."""
    if ep.empty:
        return _empty(PEER_BYTES_COLUMNS)
    keys, peer, values = _explode(ep, "bytes_to_peer", EP_PEERS_PER_RECORD)
    return keys.assign(peer=peer, bytes=values).astype(PEER_BYTES_COLUMNS)


def expert_tokens(ep: pd.DataFrame) -> pd.DataFrame:
    """Long format: step_id, layer, rank, slot, expert, tokens (tokens received by the local slot
    `slot` of `rank`, which hosts global expert `expert`; a replicated expert has several slots)."""
    if ep.empty:
        return _empty(EXPERT_TOKEN_COLUMNS)
    keys, slot, experts = _explode(ep, "expert_ids", EP_EXPERTS_PER_RECORD)
    tokens = np.fromiter((v for t in ep["expert_tokens"] for v in t), dtype=np.int64, count=len(experts))
    return keys.assign(slot=slot, expert=experts, tokens=tokens).astype(EXPERT_TOKEN_COLUMNS)


def expert_load(ep: pd.DataFrame) -> pd.DataFrame:
    """layer, expert, tokens: tokens per logical expert summed over ranks (and replicas) and steps,
    sorted by layer then expert. Same columns as correlate.moe.expert_load on the `moe` frame."""
    toks = expert_tokens(ep)
    if toks.empty:
        return _empty(LOAD_COLUMNS)
    load = toks.groupby(["layer", "expert"], as_index=False)["tokens"].sum()
    return load.astype(LOAD_COLUMNS).sort_values(["layer", "expert"], ignore_index=True)


def a2a_share(ep: pd.DataFrame, by: Sequence[str] = ("layer",)) -> pd.DataFrame:
    """Share of MoE layer time spent in all-to-all, summed over steps (and ranks, layers unless in
    `by`, a subset of ("layer", "rank"); () gives one row). Columns: *by, dispatch_s, compute_s,
    combine_s, gather_s, moe_s (the whole MoE forward), a2a_share = (dispatch + combine) / moe,
    comm_share = (dispatch + combine + gather) / moe; NaN when moe_s is 0."""
    by = list(by)
    if not set(by) <= {"layer", "rank"}:
        raise ValueError(f"by must be a subset of ('layer', 'rank'), got {by}")
    columns = {**{c: "int64" for c in by}, **SHARE_COLUMNS}
    t = _timings(ep)
    if t.empty:
        return _empty(columns)
    parts = ["dispatch_ns", "compute_ns", "combine_ns", "gather_ns", "total_ns"]
    sums = t.groupby(by, as_index=False)[parts].sum() if by else t[parts].sum().to_frame().T
    out = pd.DataFrame({c: sums[c] for c in by})
    for name in ("dispatch", "compute", "combine", "gather"):
        out[f"{name}_s"] = sums[f"{name}_ns"].to_numpy(np.float64) / 1e9
    out["moe_s"] = sums["total_ns"].to_numpy(np.float64) / 1e9
    moe = out["moe_s"].where(out["moe_s"] > 0)
    out["a2a_share"] = (out["dispatch_s"] + out["combine_s"]) / moe
    out["comm_share"] = (out["dispatch_s"] + out["combine_s"] + out["gather_s"]) / moe
    return out.astype(columns).reset_index(drop=True)


def rank_load(ep: pd.DataFrame) -> pd.DataFrame:
    """layer, rank, tokens (received by the rank's experts, summed over steps), load_over_mean
    (tokens / the layer's mean over ranks; NaN when the layer saw no tokens)."""
    toks = expert_tokens(ep)
    if toks.empty:
        return _empty(RANK_LOAD_COLUMNS)
    load = toks.groupby(["layer", "rank"], as_index=False)["tokens"].sum()
    mean = load.groupby("layer")["tokens"].transform("mean")
    load["load_over_mean"] = load["tokens"] / mean.where(mean > 0)
    return load.astype(RANK_LOAD_COLUMNS).sort_values(["layer", "rank"], ignore_index=True)


def stragglers(ep: pd.DataFrame) -> pd.DataFrame:
    """The straggler of each step: the rank whose MoE expert compute, summed over the step's
    layers, took longest (ties: the lower rank). Columns step_id, straggler, max_compute_ns,
    mean_compute_ns (over ranks), skew = max / mean (NaN when the mean is 0)."""
    t = _timings(ep)
    if t.empty:
        return _empty(STRAGGLER_COLUMNS)
    per_rank = t.groupby(["step_id", "rank"], as_index=False)["compute_ns"].sum()
    ordered = per_rank.sort_values(["step_id", "compute_ns", "rank"], ascending=[True, False, True], kind="stable")
    top = ordered.drop_duplicates("step_id").set_index("step_id")
    mean = per_rank.groupby("step_id")["compute_ns"].mean()
    out = pd.DataFrame({"step_id": top.index, "straggler": top["rank"].to_numpy(),
                        "max_compute_ns": top["compute_ns"].to_numpy(),
                        "mean_compute_ns": mean.loc[top.index].to_numpy()})
    out["skew"] = out["max_compute_ns"] / out["mean_compute_ns"].where(out["mean_compute_ns"] > 0)
    return out.astype(STRAGGLER_COLUMNS).reset_index(drop=True)


def hot_ranks(ep: pd.DataFrame, threshold: float = HOT_RANK_THRESHOLD) -> pd.DataFrame:
    """One row per rank, over all layers and steps: rank, tokens (received), load_over_mean
    (tokens / mean over ranks), compute_s, straggler_steps (steps it was the straggler of),
    straggler_share (of the steps), hot = load_over_mean >= threshold."""
    toks = expert_tokens(ep)
    if toks.empty:
        return _empty(HOT_RANK_COLUMNS)
    load = toks.groupby("rank")["tokens"].sum()
    compute = _timings(ep).groupby("rank")["compute_ns"].sum()
    strag = stragglers(ep)
    counts = strag["straggler"].value_counts()
    ranks = sorted(set(load.index) | set(compute.index))
    tokens = load.reindex(ranks, fill_value=0).to_numpy(np.int64)
    mean = tokens.mean()
    over = tokens / mean if mean > 0 else np.full(len(ranks), np.nan)
    steps = counts.reindex(ranks, fill_value=0).to_numpy(np.int64)
    out = pd.DataFrame({"rank": ranks, "tokens": tokens, "load_over_mean": over,
                        "compute_s": compute.reindex(ranks, fill_value=0).to_numpy(np.float64) / 1e9,
                        "straggler_steps": steps, "straggler_share": steps / max(len(strag), 1),
                        "hot": np.nan_to_num(over, nan=0.0) >= threshold})
    return out.astype(HOT_RANK_COLUMNS)


@dataclass(frozen=True)
class ReplicationPlan:
    """An expert replication plan for one layer and its predicted balance.

    replicas: (expert, rank) in the order they were added. placement: rank, slot, expert, replica
    (False for the home copy), load (the copy's share of the expert's load: load / copies).
    rank_load: rank, load_before, load_after. balance_*: max rank load / mean rank load (NaN for a
    layer with no load)."""

    world: int
    n_experts: int
    replicas: tuple[tuple[int, int], ...]
    placement: pd.DataFrame
    rank_load: pd.DataFrame
    balance_before: float
    balance_after: float


def _balance(loads: np.ndarray) -> float:
    mean = loads.mean()
    return float(loads.max() / mean) if mean > 0 else math.nan


def _next_copy(load: np.ndarray, hosts: list[list[int]], slots: list[list[int]], cap: int,
               rank_loads: np.ndarray) -> tuple[int, int] | None:
    """(expert, rank) of the next copy, or None: the heaviest expert per copy that some rank can
    take, on the least-loaded such rank."""
    for e in sorted(range(len(load)), key=lambda e: (-load[e] / len(hosts[e]), e)):
        if load[e] == 0:
            return None  # this and every lighter expert carry nothing: a copy would not help
        free = [r for r in range(len(slots)) if len(slots[r]) < cap and r not in hosts[e]]
        if free:
            return e, min(free, key=lambda r: (rank_loads[r], r))
    return None


def plan_replication(loads: Sequence[float] | np.ndarray | pd.Series, world: int, extra_replicas: int,
                     max_slots_per_rank: int | None = None) -> ReplicationPlan:
    """Greedy, EPLB-like: loads[e] is expert e's load; rank r starts with its home experts
    [floor(r*E/W), floor((r+1)*E/W)) (the runtime's placement). Up to extra_replicas times: take
    the expert with the heaviest load per copy (load / copies; ties: the lower id), add a copy on
    the least-loaded rank (ties: the lower rank) that has a free slot and no copy of it yet, and
    split the expert's load evenly over its copies. An expert no rank can take is passed over for
    the next heaviest; the plan stops early when none can be placed or the heaviest copy carries
    no load. Slots per rank: max_slots_per_rank, by default the largest home shard plus
    ceil(extra_replicas / W). The greedy may leave the maximum rank load higher than before;
    balance_after says so."""
    load = np.asarray(loads, dtype=np.float64).copy()
    n = len(load)
    if world < 1 or n < world:
        raise ValueError(f"need 1 <= world <= n_experts, got world {world}, {n} experts")
    if extra_replicas < 0 or (load < 0).any():
        raise ValueError("extra_replicas and loads must be non-negative")
    home = [list(range(r * n // world, (r + 1) * n // world)) for r in range(world)]
    cap = max_slots_per_rank if max_slots_per_rank is not None else (
        max(len(h) for h in home) + -(-extra_replicas // world))
    hosts = [[r] for r in range(world) for _ in home[r]]  # hosts[e]: ranks with a copy of e
    slots = [list(h) for h in home]
    added: list[tuple[int, int]] = []

    def rank_loads() -> np.ndarray:
        per_copy = [load[e] / len(hosts[e]) for e in range(n)]
        return np.array([sum(per_copy[e] for e in s) for s in slots])

    before = rank_loads()
    for _ in range(extra_replicas):
        choice = _next_copy(load, hosts, slots, cap, rank_loads())
        if choice is None:
            break
        expert, rank = choice
        hosts[expert].append(rank)
        slots[rank].append(expert)
        added.append(choice)
    after = rank_loads()
    rows = [(r, j, e, j >= len(home[r]), load[e] / len(hosts[e])) for r in range(world) for j, e in enumerate(slots[r])]
    placement = pd.DataFrame(rows, columns=["rank", "slot", "expert", "replica", "load"]).astype(
        {"rank": "int64", "slot": "int64", "expert": "int64", "replica": "bool", "load": "float64"})
    ranks = pd.DataFrame({"rank": np.arange(world, dtype=np.int64), "load_before": before, "load_after": after})
    return ReplicationPlan(world, n, tuple(added), placement, ranks, _balance(before), _balance(after))


def replication_plans(ep: pd.DataFrame, extra_replicas: int, max_slots_per_rank: int | None = None) -> pd.DataFrame:
    """plan_replication for every layer of an `ep` frame, from its logical expert loads (expert_load)
    and world. Columns: layer, world, n_experts, replicas_added, balance_before, balance_after,
    replicas (tuple of (expert, rank), in the order added)."""
    load = expert_load(ep)
    if load.empty:
        return _empty(PLAN_COLUMNS)
    world = int(ep["world"].max())
    rows = []
    for layer, grp in load.groupby("layer", sort=True):
        per_expert = np.zeros(int(grp["expert"].max()) + 1)
        per_expert[grp["expert"].to_numpy()] = grp["tokens"].to_numpy(np.float64)
        plan = plan_replication(per_expert, world, extra_replicas, max_slots_per_rank)
        rows.append((int(layer), world, plan.n_experts, len(plan.replicas), plan.balance_before,
                     plan.balance_after, plan.replicas))
    return pd.DataFrame(rows, columns=list(PLAN_COLUMNS)).astype(PLAN_COLUMNS)
