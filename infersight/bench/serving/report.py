"""bench serving's report: per arm, each figure's median over rounds and its ratio to the same round's
no-agent phase, with a distribution-free interval on the tokens/s ratio, the A/A floor, and the text table.
Pure over the phases frame (one row per arm and round, bench.serving.run.bench_serving's)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from infersight.bench.serving.config import REFERENCE, ServingBenchConfig


FIGURES = ("tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")
#: The interval on a median ratio covers it with at least this confidence (median_interval), and a run
#: resolves RESOLVE when that interval is no wider than 2 x RESOLVE (the issue's 0.5%: a cost that small
#: must show as different from 0, and a cost of 0 as smaller than it).
CONFIDENCE = 0.90
RESOLVE = 0.005


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, high, coverage): the distribution-free interval on the median of independent rounds, from
    their order statistics: the k-th smallest to the k-th largest, k the largest for which the chance
    that the median lies outside is at most 1 - confidence (binomial, p = 1/2). NaN below the rounds
    that can give it (5 for 90%: [min, max] then covers with 1 - 2/32 = 0.9375)."""
    x = np.sort(np.asarray([v for v in values if v == v], np.float64))
    n = len(x)
    best = None
    for k in range(1, n // 2 + 1):
        below = sum(math.comb(n, i) for i in range(k)) / 2 ** n  # P(fewer than k rounds below the median)
        coverage = 1 - 2 * below
        if coverage >= confidence:
            best = (float(x[k - 1]), float(x[n - k]), coverage)
    return best if best is not None else (math.nan, math.nan, math.nan)


def summarise(phases: pd.DataFrame, config: ServingBenchConfig) -> dict[str, Any]:
    """Per arm: each figure's median over rounds, and its ratio to the `none` phase of the same round
    (median over rounds); the A/A floor from `none_again`. phases: one row per (arm, round) with the
    FIGURES columns."""
    ref = phases[phases["arm"] == REFERENCE].set_index("round")
    arms: dict[str, Any] = {}
    for arm, g in phases.groupby("arm", sort=False):
        g = g.set_index("round")
        ratios = {f: g[f] / ref[f].reindex(g.index) for f in FIGURES}
        # The reference over itself is 1 by construction: no interval to give.
        low, high, coverage = (median_interval(ratios["tokens_per_s"].tolist()) if arm != REFERENCE
                               else (math.nan, math.nan, math.nan))
        arms[arm] = {"rounds": len(g),
                     # The median tokens/s ratio's distribution-free interval, and whether the run resolves
                     # RESOLVE with it (None: too few rounds to say).
                     "tokens_per_s_ratio_interval": [low, high], "interval_coverage": coverage,
                     "resolves": None if coverage != coverage else bool(high - low <= 2 * RESOLVE),
                     **{f: float(g[f].median()) for f in FIGURES},
                     **{f"{f}_ratio": float(r.median()) for f, r in ratios.items()},
                     "tokens_per_s_ratio_by_round": [round(float(x), 4) for x in ratios["tokens_per_s"]],
                     "recorder_cost_ratio": float(g["recorder_cost_ratio"].median()),
                     "recorder_windows_by_round": [float(x) for x in g.get("recorder_windows", pd.Series(dtype=float))],
                     **{f"{p}_cores": float(g[f"{p}_cores"].median()) if f"{p}_cores" in g else float("nan")
                        for p in ("serve", "engine", "agent", "client")},
                     **{f"{p}_{k}_mb_last": float(g[f"{p}_{k}_mb"].iloc[-1]) if f"{p}_{k}_mb" in g else float("nan")
                        for p in ("serve", "engine", "agent") for k in ("rss", "anon", "shmem")},
                     "errors": int(g["errors"].sum())}
    floor = {}
    if "none_again" in arms:
        by_round = np.asarray(arms["none_again"]["tokens_per_s_ratio_by_round"], np.float64)
        floor = {"tokens_per_s_aa_median": float(np.median(by_round)),
                 "tokens_per_s_aa_max_dev": float(np.max(np.abs(by_round - 1)))}
    return {"measured": True, "how": "client clock: streamed tokens (each chunk's usage.completion_tokens rise) and completions in each phase's window, "
            "each arm over the no-agent phase of its own round, median over rounds, with the median's "
            f"distribution-free interval from the rounds' order statistics (coverage >= {CONFIDENCE:.0%}; "
            f"'resolves': that interval is no wider than {2 * RESOLVE:.1%}); *_cores: CPU seconds "
            "(utime + stime from /proc) of serve (its engine process included; engine_cores: that process alone), the agent and "
            "the clients over each phase's wall time; *_rss_mb, *_anon_mb, "
            "*_shmem_mb: VmRSS, RssAnon and RssShmem (the probe ring's pages) at each phase's end",
            "config": {k: v for k, v in config.__dict__.items()}, "arms": arms, "aa_floor": floor,
            "phases": phases.to_dict("records")}


def print_report(report: dict[str, Any]) -> None:
    floor = report["aa_floor"]
    print(f"{'arm':<15} {'tok/s':>9} {'ratio':>7} {'req/s':>7} {'ratio':>7} {'TTFT p50':>9} {'p99':>8} "
          f"{'ITL p50':>8} {'p99':>8} {'recorder':>9}  cores: serve agent clients")
    for arm, a in report["arms"].items():
        print(f"{arm:<15} {a['tokens_per_s']:>9.1f} {a['tokens_per_s_ratio']:>7.4f} {a['requests_per_s']:>7.2f} "
              f"{a['requests_per_s_ratio']:>7.4f} {a['ttft_p50_s'] * 1e3:>8.1f}ms {a['ttft_p99_s'] * 1e3:>6.0f}ms "
              f"{a['itl_p50_s'] * 1e3:>6.1f}ms {a['itl_p99_s'] * 1e3:>6.1f}ms {a['recorder_cost_ratio']:>9.4f}"
              f"  {a['serve_cores']:5.2f} {a['agent_cores']:5.2f} {a['client_cores']:5.2f}")
    for arm, a in report["arms"].items():
        if arm == REFERENCE:
            continue
        low, high = a["tokens_per_s_ratio_interval"]
        verdict = ("too few rounds for an interval" if a["resolves"] is None else
                   f"{a['interval_coverage']:.1%} interval {low:.4f}-{high:.4f}: "
                   + ("resolves" if a["resolves"] else "does not resolve") + f" {RESOLVE:.1%}")
        windows = [w for w in a.get("recorder_windows_by_round", []) if w == w]
        taken = f"; recorder windows measured by round {', '.join(f'{w:.0f}' for w in windows)}" if windows else ""
        print(f"{arm:<15} tokens/s ratio {a['tokens_per_s_ratio']:.4f}, {verdict}{taken}")
    if floor:
        print(f"A/A floor (none_again / none, tokens/s): median {floor['tokens_per_s_aa_median']:.4f}, "
              f"largest deviation {floor['tokens_per_s_aa_max_dev']:.4f}")
    print("measured: " + report["how"])
