"""Switchback: what an arm costs the client, read from short blocks with the arm on and off in one phase.

Phases of 15-25 s per arm could not resolve 0.5% on the H200: a fresh `serve` drifts by a fifth over its first
minutes and phase to phase by ±5%, and a median over five rounds cannot cancel that. Here one phase runs
many pairs of adjacent blocks, the arm running in one block of each pair and paused (SIGSTOP) in the other,
half the pairs "on" first, which ones drawn at random: drift slower than a pair cancels in each pair's ratio,
and what is left of it inside the pairs cancels between the two orders (switchback_summary). The figure is
the mean on/off tokens/s ratio over pairs with a t interval; an arm that toggles nothing (none_again) is the
A/A floor of the same method.

What the figure bounds: a stopped agent's work waits (the ring keeps the records) and is done in its next on
block, so on blocks carry the arm's work at up to twice its steady rate. Work that scales with the records
(reading, folding, a recorder's windows, earned from engine time) lands there whole; work per poll does not.
The on-block loss is therefore between the steady cost of running the arm all the time and twice it: an
upper bound of the steady cost, and a check of the goal from the safe side.

Frames (client monotonic seconds, serving_clients' clock):
  blocks  pair, state ("on" or "off"), start_s, end_s (when the switch actually happened)
  tokens  request, t_s (each streamed token; a chunk's tokens share its t_s)
  requests  request, sent_s, first_s, done_s, tokens, status
"""
from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from infersight.bench.serving.report import CONFIDENCE, RESOLVE

STATES = ("on", "off")


def switchback_states(pairs: int, seed: int) -> list[str]:
    """The states of 2 x pairs blocks: each pair holds one "on" and one "off"; half the pairs (one more
    or less when odd) put "on" first, which pairs drawn at random (no period for a periodic load to match)."""
    rng = random.Random(seed)
    on_first = [True] * (pairs // 2) + [False] * (pairs - pairs // 2)
    rng.shuffle(on_first)
    return [s for first in on_first for s in (STATES if first else tuple(reversed(STATES)))]


def block_figures(blocks: pd.DataFrame, tokens: pd.DataFrame) -> pd.DataFrame:
    """blocks with tokens (streamed tokens that arrived in [start_s, end_s)) and tokens_per_s added."""
    t = np.sort(tokens["t_s"].to_numpy(np.float64))
    starts, ends = blocks["start_s"].to_numpy(np.float64), blocks["end_s"].to_numpy(np.float64)
    counts = np.searchsorted(t, ends, side="left") - np.searchsorted(t, starts, side="left")
    return blocks.assign(tokens=counts, tokens_per_s=counts / (ends - starts))


def _state_of(times: np.ndarray, blocks: pd.DataFrame) -> np.ndarray:
    """The state of the block each time falls in ("" outside every block)."""
    b = blocks.sort_values("start_s")
    starts, ends = b["start_s"].to_numpy(np.float64), b["end_s"].to_numpy(np.float64)
    i = np.searchsorted(starts, times, side="right") - 1
    inside = (i >= 0) & (times < ends[np.clip(i, 0, len(ends) - 1)])
    return np.where(inside, b["state"].to_numpy()[np.clip(i, 0, len(b) - 1)], "")


def latency_by_state(blocks: pd.DataFrame, tokens: pd.DataFrame, requests: pd.DataFrame) -> dict[str, float]:
    """TTFT p50/p99 of the requests sent in each state's blocks, and ITL p50/p99 of the gaps between a
    request's chunks whose later chunk arrived in them: {ttft_p50_s_on, ..., itl_p99_s_off}."""
    ok = requests[requests["status"] == 200]
    ttft_state = _state_of(ok["sent_s"].to_numpy(np.float64), blocks)
    ttft = (ok["first_s"] - ok["sent_s"]).to_numpy(np.float64)
    chunks = tokens.drop_duplicates().sort_values(["request", "t_s"])  # a chunk's tokens share its t_s
    gaps = chunks.groupby("request")["t_s"].diff().to_numpy(np.float64)
    gap_state = _state_of(chunks["t_s"].to_numpy(np.float64), blocks)
    out = {}
    for state in STATES:
        for name, values in (("ttft", ttft[ttft_state == state]), ("itl", gaps[(gap_state == state) & ~np.isnan(gaps)])):
            for q in (50, 99):
                out[f"{name}_p{q}_s_{state}"] = float(np.percentile(values, q)) if len(values) else math.nan
    return out


def switchback_summary(blocks: pd.DataFrame, confidence: float = CONFIDENCE) -> dict[str, Any]:
    """One arm's switchback figures from its blocks (block_figures'; a "first" column is derived from
    start_s). The figure is the on/off tokens/s ratio from the pairs' log ratios, averaged within the pairs
    that ran "on" first and within those that ran "off" first, then between the two: a drift inside the pairs
    tilts the two groups equally and oppositely, so it cancels even when the groups differ in size. A mean,
    not a median: a cost that lands in a few on blocks (a recorder window every few seconds) is the cost,
    not an outlier. The interval: Student's t on that mean (the two groups' variances, Welch's degrees
    of freedom), at `confidence`; "resolves" when it is no wider than 2 x RESOLVE. Also the ratio of the
    states' totals (all on tokens over all on seconds, against the same off)."""
    ordered = blocks.sort_values("start_s")
    wide = ordered.pivot(index="pair", columns="state", values="tokens_per_s")
    first = ordered.groupby("pair")["state"].first()
    logs = np.log(wide["on"] / wide["off"]).replace([np.inf, -np.inf], np.nan)
    groups = [logs[(first == s) & logs.notna()].to_numpy(np.float64) for s in STATES]
    seconds = (blocks["end_s"] - blocks["start_s"]).groupby(blocks["state"]).sum()
    totals = blocks.groupby("state")["tokens"].sum()
    low = high = ratio = math.nan
    if all(len(g) >= 2 for g in groups):
        mean = 0.5 * (groups[0].mean() + groups[1].mean())
        parts = [g.var(ddof=1) / len(g) for g in groups]
        se = 0.5 * math.sqrt(sum(parts))
        dof = sum(parts) ** 2 / sum(p ** 2 / (len(g) - 1) for p, g in zip(parts, groups)) if se > 0 else 1e9
        half = float(stats.t.ppf(0.5 + confidence / 2, dof)) * se
        ratio, low, high = math.exp(mean), math.exp(mean - half), math.exp(mean + half)
    return {"pairs": int(logs.notna().sum()), "pairs_on_first": int(len(groups[0])),
            "tokens_per_s_ratio": ratio, "tokens_per_s_ratio_interval": [low, high], "interval_coverage": confidence,
            "resolves": None if low != low else bool(high - low <= 2 * RESOLVE),
            "tokens_per_s_ratio_of_totals": float((totals["on"] / seconds["on"]) / (totals["off"] / seconds["off"])),
            "on_s": float(seconds["on"]), "off_s": float(seconds["off"]),
            "tokens_per_s_on": float(totals["on"] / seconds["on"]), "tokens_per_s_off": float(totals["off"] / seconds["off"]),
            "tokens_per_s_ratio_by_pair": [round(float(math.exp(x)), 4) for x in logs.dropna()]}


HOW = ("switchback, client clock: one phase per arm of adjacent block pairs, the arm running in one block of each "
       "pair and stopped (SIGSTOP) in the other, half the pairs on first (drawn); tokens/s per block from "
       "streamed tokens' arrival (each chunk's usage.completion_tokens rise); the figure is the geometric mean "
       "over pairs of on/off, averaged between the on-first and off-first pairs (a drift inside the pairs "
       f"cancels), with a Student's t interval ({CONFIDENCE:.0%}; 'resolves': no wider than "
       f"{2 * RESOLVE:.1%}); none_again toggles nothing (the A/A floor); engine_paused stops serve's engine for "
       "a known share of its on blocks (the method's known answer); latency by the state of the block a request "
       "was sent in (TTFT) or a chunk arrived in (ITL); a stopped agent's work waits for its on blocks, so the "
       "on-block loss bounds the steady cost from above (up to twice it)")
