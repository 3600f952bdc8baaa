"""The JSON API's documents, built from AgentState: summary, slowest requests, diagnosis.

Structured for programs first (stable keys, numbers in base units, NaN written as null), and
readable by people.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from infersight.agent.energy_summary import BASIS as ENERGY_BASIS, describe_energy
from infersight.agent.rings.engine_scope import by_engine, merged
from infersight.agent.rows.finished_rows import row_dicts
from infersight.agent.state import AgentState
from infersight.correlate import expert_parallel as ep_analysis
from infersight.correlate import moe, spec_advice, spec_speedup
from infersight.correlate.requests import REQUEST_FIELDS
from infersight.exporters import catalogue as C
from infersight.exporters.aggregates import quantile


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(float(value)) else float(value)
    return value


def _spec_by_task(state: AgentState) -> pd.DataFrame:
    return spec_speedup.speedup_by_task(state.spec_events, state.spec_step_timing,
                                        spec_speedup.model_error(state.engine_on_gpu))


def expert_frame(state: AgentState) -> pd.DataFrame:
    """The cumulative (layer, expert, tokens) matrix in the correlate.moe long format."""
    return moe.matrix_frame(state.expert_tokens)


def summary(state: AgentState) -> dict[str, Any]:
    with state.lock:
        rows = state.finished.frame()  # the kept rows (retention.rows_bytes), as one frame
        on = state.engine_label  # engine families' label tuples end with the engine: summed over it here
        kv_events = merged(state.counters[C.KV_EVENTS.name], on)
        prefix_q = state.counters[C.PREFIX_QUERIED.name].total()
        prefix_h = state.counters[C.PREFIX_HIT.name].total()
        prefix_r = state.counters[C.PREFIX_REQUESTS.name].total()
        prefix_hr = state.counters[C.PREFIX_HIT_REQUESTS.name].total()
        imbalance = moe.layer_imbalance(expert_frame(state))
        expert_tokens = state.expert_tokens.tolist()  # the full matrix: row = layer, column = expert
        by_task = _spec_by_task(state)
        rings = dict(state.ring_stats)
        recorder = state.recorder_summary  # None unless the flight recorder runs
        engine_by_task = dict(merged(state.counters[C.ENGINE_SECONDS.name], on).values)
        energy_by_task = dict(merged(state.counters[C.ENERGY.name], on).values)
        engines = _engine_counts(state) if on else None
        energy = describe_energy(state.energy, state.gpu_status)
        preempt = state.counters[C.PREEMPTIONS.name].total()
        pause_s = dict(merged(state.counters[C.HOST_PAUSE_SECONDS.name], on).values)
        pauses = dict(merged(state.counters[C.HOST_PAUSES.name], on).values)
        recomputed_tokens = state.counters[C.KV_RECOMPUTED_TOKENS.name].total()
        last = dict(state.last_step)
        seen = state.requests_seen
        gpu = {"status": state.gpu_status, "phase_breakdown": list(state.gpu_phases)}
        finished = state.counters[C.REQUESTS.name].total()  # all finished; `rows`: those retention keeps
        orphaned = state.counters[C.REQUESTS_ORPHANED.name].total()  # finished, but began before we saw them
        retention = {"budget_bytes": state.config.retention.rows_bytes, "requests": len(state.finished),
                     "bytes": state.finished.held_bytes, "evicted_requests": state.finished.evicted,
                     "spec_verifications": len(state.spec.window), "spec_bytes": state.spec.window.held_bytes,
                     "measured": True}
    col = (lambda c: rows[c].dropna().to_numpy()) if not rows.empty else (lambda c: np.empty(0))
    per_engine = {} if engines is None else {"engines": _engines_block(state, engines, rows)}
    return _clean({
        "requests": int(finished),
        "requests_seen": seen,
        "requests_orphaned": int(orphaned),
        "ttft_seconds": {"p50": quantile(col("ttft_s"), 0.5), "p99": quantile(col("ttft_s"), 0.99)},
        "e2e_seconds": {"p50": quantile(col("e2e_s"), 0.5), "p99": quantile(col("e2e_s"), 0.99)},
        "itl_mean_seconds": {"p50": quantile(col("itl_mean_s"), 0.5), "p99": quantile(col("itl_mean_s"), 0.99)},
        "phases_seconds_total": {p: float(col(f"{p}_s").sum()) for p in C.PHASES},
        "prefix_cache": {"token_hit_rate": prefix_h / prefix_q if prefix_q else 0.0,
                         "request_hit_rate": prefix_hr / prefix_r if prefix_r else 0.0},
        "kv": {"preemptions": int(preempt), "evictions": int(kv_events.get(("evicted",))),
               "offloads": int(kv_events.get(("offloaded",))), "reloads": int(kv_events.get(("reloaded",))),
               "recomputed_tokens": int(recomputed_tokens),
               "blocks_in_use": last.get("kv_blocks_in_use"), "blocks_cached": last.get("kv_blocks_cached"),
               "blocks_total": last.get("kv_blocks_total")},
        "moe": {"layers": [{"layer": int(r.layer), "max_over_mean": r.max_over_mean, "cv": r.cv,
                            "hot_cold_ratio": r.hot_cold_ratio} for r in imbalance.itertuples(index=False)],
                "expert_tokens": expert_tokens},
        "spec": {"by_task": spec_speedup.summary_by_task(by_task)},
        "cost": {"engine_seconds_by_task": {labels[0]: v for labels, v in engine_by_task.items()},
                 "energy_j_by_task": {labels[0]: v for labels, v in energy_by_task.items()}, "energy": energy},
        "host_pauses": {"seconds_by_generation": {labels[0]: v for labels, v in sorted(pause_s.items())},
                        "pauses_by_generation": {labels[0]: int(v) for labels, v in sorted(pauses.items())},
                        "measured": True},  # the engine process's garbage collections (gc.callbacks)
        "slow_causes": rows["slow_cause"][rows["slow_cause"] != ""].value_counts().to_dict() if not rows.empty else {},
        "slow_rule": state.slow_rule.describe(),
        "gpu": gpu,
        "expert_parallel": expert_parallel(state),
        "dropped_events": int(sum(s.get("dropped", 0) for s in rings.values())),
        "lost_events": int(sum(s.get("reader_lost", 0) for s in rings.values())),  # with a killed agent
        "sources": dict(state.source_stats),
        "rings": rings,
        "flight_recorder": recorder,
        # What the agent keeps of finished requests (--retention-mib) and of verifications: bytes of
        # the rows' data as pandas counts them (deep memory_usage), measured on the kept frames.
        "retention": retention,
        **per_engine,  # only with the engine label on (several rings)
    })


def _engine_counts(state: AgentState) -> dict[str, dict[str, float]]:
    """Per engine (the engine label's value): finished requests and their prompt and output tokens;
    under the state's lock."""
    out: dict[str, dict[str, float]] = {}
    for key, spec in (("requests", C.REQUESTS), ("prompt_tokens", C.PROMPT_TOKENS),
                      ("generation_tokens", C.GENERATION_TOKENS)):
        for engine, value in by_engine(state.counters[spec.name]).items():
            out.setdefault(engine, {}).setdefault(key, 0.0)
            out[engine][key] += value
    return out


def _engines_block(state: AgentState, counts: dict[str, dict[str, float]], rows: pd.DataFrame) -> dict[str, Any]:
    """The summary's per-engine block: the counts, and the TTFT p50 of each engine's kept rows (its
    engine from the request id's ring)."""
    engine_of = state.scope.engines_of(rows["request_id"].to_numpy(np.int64)) if not rows.empty else np.empty(0)
    ttft = rows["ttft_s"].to_numpy(np.float64) if not rows.empty else np.empty(0)
    block: dict[str, Any] = {}
    for engine in sorted(set(counts) | set(engine_of.tolist())):
        mine = ttft[engine_of == engine]
        c = counts.get(engine, {})
        block[engine] = {"requests": int(c.get("requests", 0)), "prompt_tokens": int(c.get("prompt_tokens", 0)),
                         "generation_tokens": int(c.get("generation_tokens", 0)),
                         "ttft_seconds": {"p50": quantile(mine[~np.isnan(mine)], 0.5)}}
    return block


def slowest(state: AgentState, n: int) -> list[dict[str, Any]]:
    with state.lock:
        kept = state.finished.frame()
        # Longest e2e first, ties oldest first (a stable sort): dicts for these n rows only.
        order = np.argsort(-kept["e2e_s"].to_numpy(np.float64), kind="stable")[:n] if len(kept) else []
        rows = row_dicts(kept.iloc[order]) if len(kept) else []
        # A capture analysed after a request finished still gives it its kernel time here.
        kernel = [state.kernel_seconds(int(r["request_id"])) for r in rows]  # type: ignore[call-overload]
    # energy_basis: what energy_j is, beside it in every row (null where no GPU measured it).
    return _clean([{**{k: r.get(k) for k in REQUEST_FIELDS}, "gpu_kernel_s": k_s,
                    "energy_basis": ENERGY_BASIS if r.get("energy_j") == r.get("energy_j") else None,
                    "slow_detail": r.get("slow_detail", "")} for r, k_s in zip(rows, kernel)])


#: Recent steps whose straggler rank the expert_parallel summary lists.
EP_SUMMARY_STEPS = 32


def expert_parallel(state: AgentState, extra_replicas: int = 2) -> dict[str, Any] | None:
    """All-to-all share of MoE time, hot ranks and a replication plan (None without EP records)."""
    with state.lock:
        ep = state.ep_events
    if ep.empty:
        return None
    share = ep_analysis.a2a_share(ep, by=())
    plans = ep_analysis.replication_plans(ep, extra_replicas)
    # Max/mean rank load as the records show it, under the placement that ran: with the plan's
    # replicas applied it is the measured counterpart of balance_after (predicted, even splits).
    measured = ep_analysis.rank_load(ep).groupby("layer")["load_over_mean"].max()
    stragglers = ep_analysis.stragglers(ep).tail(EP_SUMMARY_STEPS)
    return _clean({
        "world": int(ep["world"].max()),
        "a2a_share_of_moe_time": float(share["a2a_share"].iloc[0]) if not share.empty else None,
        "ranks": ep_analysis.hot_ranks(ep).drop(columns=["compute_s"]).to_dict("records"),
        "straggler_by_step": [{"step_id": int(r.step_id), "rank": int(r.straggler), "skew": r.skew}
                              for r in stragglers.itertuples(index=False)],
        "replication_plan": [{"layer": int(r.layer), "replicas": [list(x) for x in r.replicas],
                              "balance_before": r.balance_before, "balance_after": r.balance_after,
                              "balance_measured": float(measured.get(r.layer, math.nan))}
                             for r in plans.itertuples(index=False)],
    })


def diagnosis(state: AgentState) -> dict[str, Any]:
    """What is limiting this engine, in findings a program can act on and a person can read."""
    s = summary(state)
    findings: list[dict[str, Any]] = []
    phases = s["phases_seconds_total"]
    total = sum(v for v in phases.values() if v) or 0.0
    if total:
        top = max(phases, key=lambda p: phases[p] or 0.0)
        findings.append({"kind": "latency_breakdown", "phase": top, "share": (phases[top] or 0.0) / total,
                         "message": f"{top} accounts for {100 * (phases[top] or 0.0) / total:.0f}% of request time"})
    for cause, n in s["slow_causes"].items():
        findings.append({"kind": "slow_requests", "cause": cause, "count": n,
                         "message": f"{n} request{'s' if n != 1 else ''} {s['slow_rule']}, "
                                    f"from {cause.replace('_', ' ')}"})
    if s["kv"]["preemptions"]:
        findings.append({"kind": "kv_pressure", "preemptions": s["kv"]["preemptions"],
                         "recomputed_tokens": s["kv"]["recomputed_tokens"],
                         "message": f"{s['kv']['preemptions']} preemptions: the KV pool is too small for the load"})
    for layer in s["moe"]["layers"]:
        if (layer["max_over_mean"] or 0) >= 2.0:
            findings.append({"kind": "moe_imbalance", "layer": layer["layer"], "max_over_mean": layer["max_over_mean"],
                             "message": f"layer {layer['layer']}: the hottest expert gets "
                                        f"{layer['max_over_mean']:.1f}x the mean load"})
    with state.lock:
        by_task = _spec_by_task(state)
    recs = spec_advice.recommendations(by_task)
    for r in by_task[by_task["basis"] != spec_speedup.PREDICTED].itertuples(index=False):
        findings.append({"kind": "speculation_unpredicted", "task": r.task, "basis": r.basis,
                         "message": f"{r.task}: speculation's speedup cannot be predicted ({r.basis}); no advice"})
    return _clean({"findings": findings, "speculation_recommendations": recs,
                   "dropped_events": s["dropped_events"]})
