"""Two runs side by side (`infersight compare RUN_A RUN_B`): what changed from A to B, and whether
the change is larger than the noise.

Input: two RunInputs (the agent's summary document, and the run's per-request rows when it has
them). Output: one JSON-ready dict, `compare_runs`'s result, keyed by section:

    a, b            {name, requests, rows}: the run's name, its finished requests (summary), and how
                    many per-request rows were compared (None: the run has a summary only)
    latency         {ttft_s | itl_mean_s | e2e_s: {pNN: {a, b, b_minus_a, interval_95, relative,
                    verdict}}}: percentiles (numpy's linear interpolation) of each run's requests,
                    B - A with a 95% percentile-bootstrap interval (correlate.bootstrap, seeded) when
                    both runs have rows; "inside the noise" when the interval holds 0. A run with a
                    summary only gives its p50 and p99 and no interval.
    phase_shares    {phase: {a, b, b_minus_a}}: each phase's share of the summed request time
    prefix_cache    {token_hit_rate | request_hit_rate: {a, b, b_minus_a}}
    kv              {preemptions | evictions | offloads | reloads | recomputed_tokens |
                    preemptions_per_request: {a, b, b_minus_a}}
    expert_load     {layers: [{layer, tokens_a, tokens_b, max_over_mean_a, max_over_mean_b,
                    b_minus_a}], ...}: load and its imbalance (hottest expert / mean) per layer
    speculation     {task: {accept_rate | mean_accepted_length | predicted_speedup: {a, b, b_minus_a}}}
    basis           {section: how its figures were obtained, measured or modelled}

A section (or a task, a metric) that one run lacks is {"absent": "absent in NAME"}, never a guess.
Only latency has intervals: the other sections are one total per run (counters over the whole run),
with no per-request spread to resample, so their differences are stated without a noise verdict.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from infersight.correlate import moe
from infersight.correlate.bootstrap import BOOTSTRAP_RESAMPLES, quantile_difference
from infersight.correlate.requests import PARTS

#: Latency columns of the request rows -> the summary's key for the same figure.
LATENCY = {"ttft_s": "ttft_seconds", "itl_mean_s": "itl_mean_seconds", "e2e_s": "e2e_seconds"}
#: The percentiles a summary document carries (the rows give any).
SUMMARY_QUANTILES = (0.5, 0.99)
KV_COUNTS = ("preemptions", "evictions", "offloads", "reloads", "recomputed_tokens")
PREFIX_RATES = ("token_hit_rate", "request_hit_rate")
SPEC_FIGURES = ("accept_rate", "mean_accepted_length", "predicted_speedup")

BASIS = {
    "latency": "measured: each request's TTFT, mean inter-token latency and end-to-end time from the engine's "
               "monotonic timestamps as the run's agent recorded them; percentiles by linear interpolation",
    "phase_shares": "measured: per-request queue, prefill, preemption stall, decode and network seconds "
                    "(probe timestamps), summed over the run, as shares of their total",
    "prefix_cache": "measured: the engine's prefix-cache hit counters over the run (tokens hit / tokens "
                    "queried, requests with a hit / requests)",
    "kv": "measured: KV event counters over the run (counts); preemptions_per_request = preemptions / "
          "finished requests",
    "expert_load": "measured: tokens routed to each expert over the run (probe counts); max_over_mean = "
                   "hottest expert's tokens / the layer's mean per expert",
    "speculation": "accept_rate and mean_accepted_length measured (verifications' accepted / drafted "
                   "tokens); predicted_speedup modelled (correlate.spec_speedup, not measured)",
}


@dataclass(frozen=True)
class RunInputs:
    """One run as compare_runs reads it.

    name: what the result calls the run (its folder); summary: the agent's /api/v1/summary document
    (keys may be missing: a section it lacks is reported absent); requests: per-request rows with
    the LATENCY columns and PARTS in seconds (infersight.exporters.parquet.SCHEMA), None when the
    run has only a summary."""

    name: str
    summary: Mapping[str, Any]
    requests: pd.DataFrame | None = None


@dataclass(frozen=True)
class CompareConfig:
    """quantiles: the latency percentiles compared (each in (0, 1)); resamples and seed: the
    bootstrap's (the same inputs and seed give the same intervals)."""

    quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)
    resamples: int = BOOTSTRAP_RESAMPLES
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.quantiles or not all(0.0 < q < 1.0 for q in self.quantiles):
            raise ValueError(f"quantiles must be in (0, 1), got {self.quantiles}")
        if self.resamples < 100:
            raise ValueError(f"resamples must be at least 100 for a 95% interval, got {self.resamples}")


def percentile_key(q: float) -> str:
    """0.5 -> "p50", 0.99 -> "p99", 0.999 -> "p99.9"."""
    return f"p{q * 100:g}"


def _num(value: Any) -> float | None:
    """A JSON-safe float: None for None, NaN and inf."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _dig(doc: Mapping[str, Any], *keys: str) -> Any:
    """doc[k1][k2]..., None where a key (or a level) is missing."""
    for k in keys:
        doc = doc.get(k) if isinstance(doc, Mapping) else None
    return doc


def _absent(a: RunInputs, b: RunInputs, in_a: bool, in_b: bool) -> dict[str, str]:
    names = [r.name for r, there in ((a, in_a), (b, in_b)) if not there]
    return {"absent": f"absent in {' and '.join(names)}"}


def _pair(a: Any, b: Any) -> dict[str, float | None]:
    """{a, b, b_minus_a} of two figures (b_minus_a None unless both are numbers)."""
    fa, fb = _num(a), _num(b)
    return {"a": fa, "b": fb, "b_minus_a": None if fa is None or fb is None else fb - fa}


def _column(run: RunInputs, column: str) -> np.ndarray | None:
    """The column's finite values, or None when the run has no rows or no such column."""
    if run.requests is None or column not in run.requests.columns:
        return None
    values = pd.to_numeric(run.requests[column], errors="coerce").to_numpy(np.float64)
    values = values[np.isfinite(values)]
    return values if len(values) else None


def latency(a: RunInputs, b: RunInputs, config: CompareConfig) -> dict[str, Any]:
    """The latency section (see the module docstring)."""
    rng = np.random.default_rng(config.seed)
    out: dict[str, Any] = {}
    for column, summary_key in LATENCY.items():
        rows_a, rows_b = _column(a, column), _column(b, column)
        if rows_a is not None and rows_b is not None:
            out[column] = {percentile_key(q): {"a": float(np.quantile(rows_a, q)), "b": float(np.quantile(rows_b, q)),
                                               **quantile_difference(rows_a, rows_b, rng, q, config.resamples)}
                           for q in config.quantiles}
            continue
        # A summary-only run: its p50 and p99, no interval (there is nothing to resample).
        quantiles = {}
        for q in SUMMARY_QUANTILES:
            va = float(np.quantile(rows_a, q)) if rows_a is not None else _num(_dig(a.summary, summary_key, percentile_key(q)))
            vb = float(np.quantile(rows_b, q)) if rows_b is not None else _num(_dig(b.summary, summary_key, percentile_key(q)))
            if va is None or vb is None:
                quantiles[percentile_key(q)] = _absent(a, b, va is not None, vb is not None)
                continue
            without = " and ".join(r.name for r, rows in ((a, rows_a), (b, rows_b)) if rows is None)
            quantiles[percentile_key(q)] = {**_pair(va, vb), "interval_95": None,
                                            "verdict": f"no interval: per-request rows absent in {without}"}
        out[column] = quantiles
    return out


def _phase_seconds(run: RunInputs) -> dict[str, float] | None:
    """Seconds per phase summed over the run's requests: from the rows when they have every phase,
    else the summary's phases_seconds_total; None when neither has a positive total."""
    if run.requests is not None and all(p in run.requests.columns for p in PARTS) and len(run.requests):
        totals = {p: float(pd.to_numeric(run.requests[p], errors="coerce").sum()) for p in PARTS}
    else:
        doc = _dig(run.summary, "phases_seconds_total")
        if not isinstance(doc, Mapping):
            return None
        totals = {(p if p.endswith("_s") else f"{p}_s"): float(v or 0.0) for p, v in doc.items()}
    return totals if sum(totals.values()) > 0 else None


def phase_shares(a: RunInputs, b: RunInputs) -> dict[str, Any]:
    sa, sb = _phase_seconds(a), _phase_seconds(b)
    if sa is None or sb is None:
        return _absent(a, b, sa is not None, sb is not None)
    ta, tb = sum(sa.values()), sum(sb.values())
    return {p: _pair(sa.get(p, 0.0) / ta, sb.get(p, 0.0) / tb) for p in dict.fromkeys([*sa, *sb])}


def _figures(a: RunInputs, b: RunInputs, section: str, names: tuple[str, ...]) -> dict[str, Any]:
    da, db = _dig(a.summary, section), _dig(b.summary, section)
    if not isinstance(da, Mapping) or not isinstance(db, Mapping):
        return _absent(a, b, isinstance(da, Mapping), isinstance(db, Mapping))
    return {n: _pair(da.get(n), db.get(n)) if n in da and n in db else _absent(a, b, n in da, n in db)
            for n in names}


def kv(a: RunInputs, b: RunInputs) -> dict[str, Any]:
    out = _figures(a, b, "kv", KV_COUNTS)
    if "absent" not in out:
        per_request = [_num(_dig(r.summary, "kv", "preemptions")) for r in (a, b)]
        finished = [_num(_dig(r.summary, "requests")) for r in (a, b)]
        out["preemptions_per_request"] = _pair(*(p / n if p is not None and n else None
                                                 for p, n in zip(per_request, finished)))
    return out


def _imbalance(run: RunInputs) -> pd.DataFrame | None:
    """correlate.moe.layer_imbalance of the summary's [layer][expert] token matrix; None when the
    run routed no token (a dense model, or no MoE counts)."""
    matrix = _dig(run.summary, "moe", "expert_tokens")
    if not matrix:
        return None
    tokens = np.asarray(matrix, dtype=np.int64)
    if tokens.ndim != 2 or not tokens.sum():
        return None
    return moe.layer_imbalance(moe.matrix_frame(tokens)).set_index("layer")


def expert_load(a: RunInputs, b: RunInputs) -> dict[str, Any]:
    ia, ib = _imbalance(a), _imbalance(b)
    if ia is None or ib is None:
        return _absent(a, b, ia is not None, ib is not None)
    layers = []
    for layer in sorted(set(ia.index) | set(ib.index)):
        if layer not in ia.index or layer not in ib.index:
            layers.append({"layer": int(layer), **_absent(a, b, layer in ia.index, layer in ib.index)})
            continue
        pair = _pair(ia.at[layer, "max_over_mean"], ib.at[layer, "max_over_mean"])
        layers.append({"layer": int(layer), "tokens_a": int(ia.at[layer, "tokens"]),
                       "tokens_b": int(ib.at[layer, "tokens"]), "max_over_mean_a": pair["a"],
                       "max_over_mean_b": pair["b"], "b_minus_a": pair["b_minus_a"]})
    worst = [max((r.get(f"max_over_mean_{s}") or 0.0) for r in layers) for s in ("a", "b")]
    return {"layers": layers, "worst_layer_max_over_mean": _pair(*worst)}


def speculation(a: RunInputs, b: RunInputs) -> dict[str, Any]:
    ta, tb = _dig(a.summary, "spec", "by_task") or {}, _dig(b.summary, "spec", "by_task") or {}
    if not ta or not tb:
        return _absent(a, b, bool(ta), bool(tb))
    out: dict[str, Any] = {}
    for task in sorted(set(ta) | set(tb)):
        if task not in ta or task not in tb:
            out[task] = _absent(a, b, task in ta, task in tb)
            continue
        out[task] = {n: _pair(ta[task].get(n), tb[task].get(n)) for n in SPEC_FIGURES}
    return out


def compare_runs(a: RunInputs, b: RunInputs, config: CompareConfig | None = None) -> dict[str, Any]:
    """B against A, section by section (the module docstring lists the result's keys)."""
    config = config or CompareConfig()

    def run(r: RunInputs) -> dict[str, Any]:
        return {"name": r.name, "requests": _dig(r.summary, "requests"),
                "rows": None if r.requests is None else len(r.requests)}

    basis = dict(BASIS)
    basis["latency"] += (f"; B - A intervals: a {config.resamples}-resample percentile bootstrap over each "
                         f"run's requests (seed {config.seed}), 'inside the noise' when the 95% interval holds 0; each "
                         "interval is 95% on its own, so two runs of one distribution still get about one row in "
                         "20 called higher or lower")
    return {"a": run(a), "b": run(b), "latency": latency(a, b, config), "phase_shares": phase_shares(a, b),
            "prefix_cache": _figures(a, b, "prefix_cache", PREFIX_RATES), "kv": kv(a, b),
            "expert_load": expert_load(a, b), "speculation": speculation(a, b), "basis": basis}
