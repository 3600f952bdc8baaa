"""What each kind of step measurably costs, per engine and batch size: the inputs of spec_speedup.

step_costs: medians of the pure-decode plain probe and speculative steps per (engine, batch size);
mixed_costs: a plain mixed step's time, fitted on the plain mixed probe steps; speed_factors: how fast
the machine ran around a given time, relative to those medians; _at_batch: a cost at any batch size,
interpolated. The model that combines them, and why each part is there, is spec_speedup's docstring.
Step records are the `step_timing` frame (correlate.frames); a step that captured a CUDA graph paid a
one-time cost and is no sample.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: Request and step ids carry their engine (ring) index above this bit (agent.rings.ingest.RING_ID_SHIFT).
ENGINE_ID_SHIFT = 48
#: Probe steps a speculative step is compared with: the nearest in time at its batch size.
LOCAL_PROBES = 4

COST_COLUMNS = {"engine": "int64", "batch": "int64", "probe_steps": "int64", "plain_samples": "int64",
                "spec_steps": "int64",
                "plain_step_ns": "float64", "plain_forward_ns": "float64", "spec_step_ns": "float64",
                "draft_ns_per_forward": "float64", "verify_ns": "float64", "verify_extra_ns": "float64",
                "plain_rel_mad": "float64", "spec_rel_mad": "float64"}
MIXED_COLUMNS = {"engine": "int64", "mixed_probes": "int64", "spec_mixed_steps": "int64", "extra_ns": "float64",
                 "prefill_ns_per_token": "float64", "resid_rel": "float64"}
def _empty(columns: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})


def _rel_mad(x: pd.Series) -> float:
    """Median absolute deviation relative to the median; NaN below two samples."""
    if len(x) < 2:
        return float("nan")
    med = float(x.median())
    return float((x - med).abs().median() / med) if med > 0 else float("nan")


def _pure_decode(t: pd.DataFrame) -> pd.Series:
    return (t["prefill_tokens"] == 0) & (t["decode_requests"] > 0)


def _unsteady(t: pd.DataFrame) -> pd.Series | bool:
    """Steps that are no sample of the steady step time: one that captured a CUDA graph (a one-time
    cost); one torch.profiler recorded (a capture window runs eagerly, under its callbacks: on CUDA a
    plain decode step then takes an eager forward's 9-14 ms instead of a replay's ~1 ms); one whose
    schedule preempted or swapped in requests (KV pressure: the H200 demo's plain probe steps of
    ~1 ms took 29-47 ms when their schedule moved KV to or from the CPU tier, and a handful of them
    among a batch size's few probes set its median; the moves cost an engine without the draft the
    same, so they are no part of what the draft changes)."""
    captured = t["graph_captures"] > 0 if "graph_captures" in t else False
    profiled = t["profiled"].astype(bool) if "profiled" in t else False
    moved = t["kv_moves"] > 0 if "kv_moves" in t else False
    return captured | profiled | moved


def _steady(t: pd.DataFrame) -> pd.Series:
    """Pure-decode plain probe and speculative steps that are samples of the steady step time."""
    return _pure_decode(t) & (t["spec_probe"] | (t["spec_tokens"] > 0)) & ~_unsteady(t)


def _pricing_probes(probe: pd.DataFrame, engine: np.ndarray) -> pd.DataFrame:
    """The pure-decode plain probe steps that price a plain engine's step: an engine's steady async
    probes (launched ahead, and launching the step after ahead: the middle of a probe run,
    runtime.speculative.spec_probe) where it ran any, for a plain engine under async scheduling pays
    about max(host, device) a step where a lone synchronous probe pays host + device; every probe otherwise (no
    async scheduling, or records from before STEP_TIMING v3)."""
    if "launched_ahead" not in probe or "launched_next" not in probe:
        return probe
    steady = (probe["launched_ahead"].astype(bool) & probe["launched_next"].astype(bool)).to_numpy()
    async_engines = np.unique(engine[steady])
    return probe[steady | ~np.isin(engine, async_engines)]


def step_costs(step_timing: pd.DataFrame) -> pd.DataFrame:
    """One row per (engine, batch) with a pure-decode step: probe_steps and spec_steps (the steps of each
    kind that are samples of the steady step time), plain_samples (those of the probes that price the plain
    step, _pricing_probes: all of them without async scheduling) and the medians Tp
    (plain_step_ns), the plain target forward, Ts (spec_step_ns),
    draft time per draft forward, the verify forward, and X (verify_extra_ns). NaN where that
    kind of step was not seen at that batch size."""
    t = step_timing[_steady(step_timing)]
    if t.empty:
        return _empty(COST_COLUMNS)
    t = t.assign(engine=t["step_id"].to_numpy(np.int64) >> ENGINE_ID_SHIFT, batch=t["decode_requests"],
                 dur=t["end_ns"] - t["start_ns"], less_draft=t["end_ns"] - t["start_ns"] - t["draft_ns"],
                 target=t["target_ns"].where(t["target_ns"] >= 0),
                 per_forward=t["draft_ns"] / t["draft_forwards"].where(t["draft_forwards"] > 0))
    probe, spec = t[t["spec_probe"]], t[~t["spec_probe"]]
    pricing = _pricing_probes(probe, probe["engine"].to_numpy(np.int64))
    keys = ["engine", "batch"]
    plain = pricing.groupby(keys).agg(plain_samples=("dur", "size"), plain_step_ns=("dur", "median"),
                                      plain_forward_ns=("target", "median"), plain_rel_mad=("dur", _rel_mad))
    plain = probe.groupby(keys).agg(probe_steps=("dur", "size")).join(plain, how="outer")
    sp = spec.groupby(keys).agg(spec_steps=("dur", "size"), spec_step_ns=("dur", "median"),
                                spec_rel_mad=("dur", _rel_mad),
                                draft_ns_per_forward=("per_forward", "median"), verify_ns=("target", "median"),
                                less_draft=("less_draft", "median"))
    out = plain.join(sp, how="outer").reset_index().reindex(columns=[*COST_COLUMNS, "less_draft"])
    out[["probe_steps", "plain_samples", "spec_steps"]] = out[["probe_steps", "plain_samples", "spec_steps"]].fillna(0)
    out["verify_extra_ns"] = out["less_draft"] - out["plain_step_ns"]
    return out[list(COST_COLUMNS)].astype(COST_COLUMNS)


def _line_fit(p: np.ndarray, y: np.ndarray) -> tuple[float, float, np.ndarray]:
    """y ~ e + slope x p with slope >= 0 (a negative slope: the median alone), then once more without
    the points whose residual is beyond 3 robust standard deviations (1.4826 MAD): one step that
    hit something else (a page fault, another tenant) does not move the line. Returns (e, slope,
    the kept points' residuals)."""
    def fit(keep: np.ndarray) -> tuple[float, float]:
        pk, yk = p[keep], y[keep]
        if len(pk) >= 2 and np.ptp(pk) > 0:
            slope, e = np.polyfit(pk, yk, 1)
            if slope >= 0:
                return float(e), float(slope)
        return float(np.median(yk)), 0.0
    keep = np.ones(len(y), dtype=bool)
    e, slope = fit(keep)
    resid = y - e - slope * p
    mad = float(np.median(np.abs(resid - np.median(resid))))
    if mad > 0:
        keep = np.abs(resid - np.median(resid)) <= 3 * 1.4826 * mad
        e, slope = fit(keep)
    return e, slope, (y - e - slope * p)[keep]


def mixed_costs(step_timing: pd.DataFrame, costs: pd.DataFrame) -> pd.DataFrame:
    """One row per engine with plain mixed probe steps (columns MIXED_COLUMNS): a plain mixed step
    is a plain decode step at its batch size, Tp(b) (costs: step_costs), plus what its prefill chunks
    add, extra_ns + prefill_ns_per_token x P, fitted on the probes' time less Tp(b) (_line_fit; one
    sample: its own excess). resid_rel: the kept residuals' standard deviation over the mean probe
    step (NaN below four samples); spec_mixed_steps: the speculative mixed steps beside them."""
    t = step_timing
    mixed = (t["prefill_tokens"] > 0) & (t["decode_requests"] > 0) & ~_unsteady(t)
    probes, spec = t[mixed & t["spec_probe"]], t[mixed & (t["spec_tokens"] > 0)]
    rows = []
    spec_eng = spec["step_id"].to_numpy(np.int64) >> ENGINE_ID_SHIFT
    probe_eng = probes["step_id"].to_numpy(np.int64) >> ENGINE_ID_SHIFT
    for eng in np.unique(probe_eng):
        g = probes[probe_eng == eng]
        dur = (g["end_ns"] - g["start_ns"]).to_numpy(np.float64)
        tp = _at_batch(costs, np.full(len(g), eng), g["decode_requests"].to_numpy(np.float64), "plain_step_ns")
        if not np.isfinite(tp).all():  # no plain pure-decode step of this engine to stand on
            continue
        extra, slope, resid = _line_fit(g["prefill_tokens"].to_numpy(np.float64), dur - tp)
        rows.append({"engine": int(eng), "mixed_probes": len(g), "spec_mixed_steps": int((spec_eng == eng).sum()),
                     "extra_ns": extra, "prefill_ns_per_token": slope,
                     "resid_rel": float(resid.std(ddof=2) / dur.mean()) if len(resid) >= 4 else float("nan")})
    return pd.DataFrame(rows).astype(MIXED_COLUMNS) if rows else _empty(MIXED_COLUMNS)


def speed_factors(step_timing: pd.DataFrame, costs: pd.DataFrame, engine: np.ndarray, ts_ns: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """How fast the machine ran plain and speculative pure-decode steps around each time ts_ns
    (of engine), relative to the medians over the whole window: the median of duration / median
    at its batch size over the LOCAL_PROBES probe steps nearest in time (and over as many
    speculative steps as those probes span). 1 where an engine has no such steps."""
    t = step_timing[_steady(step_timing)]
    eng_of = t["step_id"].to_numpy(np.int64) >> ENGINE_ID_SHIFT
    out = (np.ones(len(ts_ns)), np.ones(len(ts_ns)))
    for e in np.unique(eng_of):
        sel = engine == e
        g = t[eng_of == e].sort_values("start_ns")
        probes, spec = g[g["spec_probe"]], g[~g["spec_probe"]]
        probes = _pricing_probes(probes, np.full(len(probes), e))
        span = max(1, round(LOCAL_PROBES * len(spec) / max(1, len(probes))))
        for k, (steps, column, window) in enumerate(((probes, "plain_step_ns", LOCAL_PROBES),
                                                     (spec, "spec_step_ns", span))):
            if steps.empty or not sel.any():
                continue
            typical = _at_batch(costs, np.full(len(steps), e), steps["decode_requests"].to_numpy(np.float64), column)
            ratio = pd.Series((steps["end_ns"] - steps["start_ns"]).to_numpy(np.float64) / typical)
            factor = ratio.rolling(window, center=True, min_periods=1).median().to_numpy()
            at = steps["start_ns"].to_numpy()
            after = np.clip(np.searchsorted(at, ts_ns[sel]), 0, len(at) - 1)
            before = np.clip(after - 1, 0, len(at) - 1)
            nearest = np.where(np.abs(ts_ns[sel] - at[before]) <= np.abs(at[after] - ts_ns[sel]), before, after)
            out[k][sel] = factor[nearest]
    return out


def _at_batch(costs: pd.DataFrame, engine: np.ndarray, batch: np.ndarray, column: str) -> np.ndarray:
    """costs[column] at each (engine, batch): linear between the nearest batch sizes that have it,
    the nearest one beyond them; NaN for an engine without any."""
    out = np.full(len(batch), np.nan)
    for eng, grp in costs[costs[column].notna()].groupby("engine"):
        sel = engine == eng
        g = grp.sort_values("batch")
        out[sel] = np.interp(batch[sel], g["batch"].to_numpy(np.float64), g[column].to_numpy(np.float64))
    return out


def plain_mixed_ns(j: pd.DataFrame, plain_step: np.ndarray, excess: np.ndarray) -> np.ndarray:
    """Per verification, a plain mixed step's time beside a plain decode step of plain_step: plain_step + the
    fitted excess (never below a plain decode step) where the plain mixed probes gave one; else the speculative
    mixed step less its draft phase and verify extra, but at least plain_step."""
    fallback = np.maximum((j["dur_ns"] - j["step_draft_ns"] - j["_verify_extra_ns"]).to_numpy(np.float64), plain_step)
    return np.where(np.isfinite(excess), plain_step + np.maximum(np.nan_to_num(excess), 0.0), fallback)
