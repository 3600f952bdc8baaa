"""Switchback: what an arm costs the client, read from short blocks with the arm on and off in one phase.

Phases of 15-25 s per arm could not resolve 0.5% on the H200: a fresh `serve` drifts by a fifth over its first
minutes and phase to phase by ±5%, and a median over five rounds cannot cancel that. Here one phase runs
many pairs of adjacent blocks, the arm running in one block of each pair and paused (SIGSTOP) in the other,
the order within each pair drawn at random (a linear drift favours neither state): drift slower than a pair
cancels in each pair's ratio. The figure is the median over pairs of on/off tokens/s, with the median's
distribution-free interval (serving_report.median_interval); an arm that toggles nothing (none_again) is
the A/A floor of the same method.

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

from infersight.bench.serving_report import CONFIDENCE, RESOLVE, median_interval

STATES = ("on", "off")


def switchback_states(pairs: int, seed: int) -> list[str]:
    """The states of 2 x pairs blocks: each pair holds one "on" and one "off", in an order drawn per pair."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(pairs):
        out += list(STATES) if rng.random() < 0.5 else list(reversed(STATES))
    return out


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


def switchback_summary(blocks: pd.DataFrame) -> dict[str, Any]:
    """One arm's switchback figures from its blocks (block_figures'): the median over pairs of on/off
    tokens/s with its distribution-free interval and whether that resolves RESOLVE, and the ratio of the
    states' totals (all on tokens over all on seconds, against the same off)."""
    wide = blocks.pivot(index="pair", columns="state", values="tokens_per_s")
    ratios = (wide["on"] / wide["off"]).replace([np.inf, -np.inf], np.nan).dropna()
    low, high, coverage = median_interval(ratios.tolist())
    seconds = (blocks["end_s"] - blocks["start_s"]).groupby(blocks["state"]).sum()
    totals = blocks.groupby("state")["tokens"].sum()
    return {"pairs": int(len(ratios)),
            "tokens_per_s_ratio": float(ratios.median()) if len(ratios) else math.nan,
            "tokens_per_s_ratio_interval": [low, high], "interval_coverage": coverage,
            "resolves": None if coverage != coverage else bool(high - low <= 2 * RESOLVE),
            "tokens_per_s_ratio_of_totals": float((totals["on"] / seconds["on"]) / (totals["off"] / seconds["off"])),
            "on_s": float(seconds["on"]), "off_s": float(seconds["off"]),
            "tokens_per_s_on": float(totals["on"] / seconds["on"]), "tokens_per_s_off": float(totals["off"] / seconds["off"]),
            "tokens_per_s_ratio_by_pair": [round(float(r), 4) for r in ratios]}


HOW = ("switchback, client clock: one phase per arm of adjacent block pairs, the arm running in one block of each "
       "pair and stopped (SIGSTOP) in the other, the order drawn per pair; tokens/s per block from streamed "
       "tokens' arrival (each chunk's usage.completion_tokens rise); the figure is the median over pairs of "
       f"on/off, with its distribution-free interval (coverage >= {CONFIDENCE:.0%}; 'resolves': no wider than "
       f"{2 * RESOLVE:.1%}); none_again toggles nothing (the A/A floor); engine_paused stops serve's engine for "
       "a known share of its on blocks (the method's known answer); latency by the state of the block a request "
       "was sent in (TTFT) or a chunk arrived in (ITL)")
