"""bench.serving.switchback: block states, block figures and the summary by hand on tiny frames, and a drifting
synthetic load whose on-block effect is known in advance."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from infersight.bench.serving.switchback import block_figures, latency_by_state, switchback_states, switchback_summary


def test_each_pair_holds_one_on_and_one_off_in_a_drawn_order() -> None:
    states = switchback_states(200, seed=3)
    pairs = [tuple(states[i:i + 2]) for i in range(0, len(states), 2)]
    assert len(states) == 400 and set(pairs) == {("on", "off"), ("off", "on")}
    assert sum(p == ("on", "off") for p in pairs) == 100  # half on first
    assert pairs[:6] != [("on", "off"), ("off", "on")] * 3 and pairs[:6] != [("off", "on"), ("on", "off")] * 3
    assert switchback_states(200, seed=3) == states and switchback_states(200, seed=4) != states


def test_block_figures_count_tokens_in_each_half_open_block() -> None:
    blocks = pd.DataFrame({"pair": [0, 0], "state": ["on", "off"], "start_s": [10.0, 12.0], "end_s": [12.0, 13.0]})
    tokens = pd.DataFrame({"request": [1, 1, 1, 2, 2, 2], "t_s": [9.9, 10.0, 11.5, 12.0, 12.5, 13.0]})
    out = block_figures(blocks, tokens)
    assert out["tokens"].tolist() == [2, 2]  # 10.0 and 11.5 | 12.0 and 12.5 (9.9 before, 13.0 at the end)
    assert out["tokens_per_s"].tolist() == [1.0, 2.0]


def _blocks(pairs: list[tuple[str, float, float]]) -> pd.DataFrame:
    """1-s blocks from (first state, on tokens, off tokens) per pair."""
    rows = []
    for pair, (first, on, off) in enumerate(pairs):
        order = [("on", on), ("off", off)] if first == "on" else [("off", off), ("on", on)]
        for k, (state, tokens) in enumerate(order):
            rows.append({"pair": pair, "state": state, "start_s": 2.0 * pair + k, "end_s": 2.0 * pair + k + 1,
                         "tokens": tokens})
    return pd.DataFrame(rows).assign(tokens_per_s=lambda f: f["tokens"] / (f["end_s"] - f["start_s"]))


def test_the_summary_averages_log_ratios_within_each_order_then_between_them() -> None:
    # On first: ratios 0.9, 1.0, 0.8; off first: 1.1, 0.95.
    s = switchback_summary(_blocks([("on", 90, 100), ("on", 100, 100), ("on", 80, 100), ("off", 110, 100),
                                    ("off", 95, 100)]))
    a, b = np.log([0.9, 1.0, 0.8]), np.log([1.1, 0.95])
    mean = (a.mean() + b.mean()) / 2
    se = 0.5 * math.sqrt(a.var(ddof=1) / 3 + b.var(ddof=1) / 2)
    dof = (a.var(ddof=1) / 3 + b.var(ddof=1) / 2) ** 2 / ((a.var(ddof=1) / 3) ** 2 / 2 + (b.var(ddof=1) / 2) ** 2 / 1)
    from scipy import stats
    t = stats.t.ppf(0.95, dof)
    assert s["pairs"] == 5 and s["pairs_on_first"] == 3 and s["tokens_per_s_ratio"] == pytest.approx(math.exp(mean))
    assert s["tokens_per_s_ratio_interval"] == pytest.approx([math.exp(mean - t * se), math.exp(mean + t * se)])
    assert s["tokens_per_s_ratio_of_totals"] == pytest.approx(475 / 500)
    assert s["resolves"] is False and s["on_s"] == 5.0 and s["off_s"] == 5.0


def test_a_drift_inside_the_pairs_cancels_between_the_orders_even_when_they_differ_in_number() -> None:
    # A true ratio 0.98 and a drift of -2% from a pair's first block to its second: on-first pairs read
    # 0.98 / 0.98 = 1.0, off-first pairs 0.98 x 0.98 / 1.0; three of one, one of the other.
    s = switchback_summary(_blocks([("on", 98, 98), ("on", 98, 98), ("on", 98, 98), ("off", 98 * 0.98, 100)]
                                   + [("off", 98 * 0.98, 100)]))
    assert s["tokens_per_s_ratio"] == pytest.approx(0.98)
    assert s["tokens_per_s_ratio_interval"] == pytest.approx([0.98, 0.98]) and s["resolves"] is True


def _drifting_load(effect: float, pairs: int, block_s: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tokens from a server whose rate falls from 10,000 to 7,000 tokens/s over the phase (a fresh serve's
    settling, as measured on the H200) with a slow ±5% wave on top, and is `effect` times that in on blocks."""
    states = switchback_states(pairs, seed)
    starts = np.arange(len(states)) * block_s
    span = len(states) * block_s
    times = []
    for start, state in zip(starts, states):
        t, end = start, start + block_s
        while t < end:
            base = 10_000 - 3_000 * t / span
            rate = base * (1 + 0.05 * math.sin(2 * math.pi * t / 37.0)) * (effect if state == "on" else 1.0)
            t += 1.0 / rate
            if t < end:
                times.append(t)
    blocks = pd.DataFrame({"pair": np.arange(len(states)) // 2, "state": states, "start_s": starts,
                           "end_s": starts + block_s})
    return blocks, pd.DataFrame({"request": 0, "t_s": times})


def test_a_known_half_percent_loss_is_read_back_through_a_drift_sixty_times_larger() -> None:
    blocks, tokens = _drifting_load(effect=0.995, pairs=40, block_s=1.0, seed=7)
    s = switchback_summary(block_figures(blocks, tokens))
    # The drift between the phase's first and last blocks is 30%; adjacent pairs leave ~0.1% of it.
    assert s["tokens_per_s_ratio"] == pytest.approx(0.995, abs=0.0015)
    low, high = s["tokens_per_s_ratio_interval"]
    assert low < 0.995 < high and high < 1.0 and s["resolves"] is True
    # The same load without the effect: the interval holds 1.
    blocks, tokens = _drifting_load(effect=1.0, pairs=40, block_s=1.0, seed=7)
    low, high = switchback_summary(block_figures(blocks, tokens))["tokens_per_s_ratio_interval"]
    assert low < 1.0 < high


def test_latency_by_state_takes_ttft_by_the_block_a_request_was_sent_in_and_itl_by_the_later_chunk() -> None:
    blocks = pd.DataFrame({"pair": [0, 0], "state": ["on", "off"], "start_s": [0.0, 1.0], "end_s": [1.0, 2.0]})
    # Request 1 sent at 0.2 (on): chunks 0.5, 0.9, 1.4 -> TTFT 0.3; gaps 0.4 (ends on), 0.5 (ends off).
    # Request 2 sent at 1.1 (off): chunks 1.3, 1.3 (two tokens, one chunk), 1.9 -> TTFT 0.2; gap 0.6 (off).
    tokens = pd.DataFrame({"request": [1, 1, 1, 2, 2, 2], "t_s": [0.5, 0.9, 1.4, 1.3, 1.3, 1.9]})
    requests = pd.DataFrame({"request": [1, 2], "sent_s": [0.2, 1.1], "first_s": [0.5, 1.3], "done_s": [1.4, 1.9],
                             "tokens": [3, 3], "status": [200, 200]})
    f = latency_by_state(blocks, tokens, requests)
    assert f["ttft_p50_s_on"] == pytest.approx(0.3) and f["ttft_p50_s_off"] == pytest.approx(0.2)
    assert f["itl_p50_s_on"] == pytest.approx(0.4)
    assert f["itl_p50_s_off"] == pytest.approx(0.55) and f["itl_p99_s_off"] == pytest.approx(0.5 + 0.99 * 0.1)
