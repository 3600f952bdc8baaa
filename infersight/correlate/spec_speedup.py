"""Speculative decoding's speedup per task, predicted from what each part of a step measurably costs.

The step times are measured; the speedup is a prediction from them (what an engine without the
draft would do), never a measurement of one: `infersight bench speculation` measures it, by
running the same requests on an engine with and one without the draft and timing both with the
client's wall clock, and CI checks that the measurement lies in the interval printed here
(tests/bench/speculation/test_spec_ab.py).

Inputs: the `spec` frame (one row per verification) and the `step_timing` frame (one row per
step; spec_probe marks the plain decode steps an engine ran on purpose, runtime.speculative.spec_probe).
Each verification is joined to the step it happened in: ts_ns within [start_ns, end_ns] of a
speculative step of the same engine (request and step ids share their bits above ENGINE_ID_SHIFT,
which is how the agent keeps several engines apart). A step that captured a CUDA graph
(graph_captures > 0) paid a one-time cost: it is left out of every median below. (On CUDA the
first plain step at each batch size and context-width bucket captures a graph, and the probe
rule makes that first step a probe: before this, the "plain" medians of a workload whose batch
size wanders were mostly captures, slower than the speculative steps.) Per batch size b
(requests decoding):

    Ts(b)  median time of a speculative pure-decode step (every request decoding)
    Tp(b)  median time of a plain probe step                 (interpolated between probed sizes)
    X(b)   median (speculative step - its draft phase) - Tp(b): the verify and sampling extra

Under async scheduling (CUDA's default) a plain engine launches each decode step before reading the one
before, so its step costs about max(host, device); the speculative engine's steps, and a lone plain probe
among them, run synchronously: host + device. There probes come in runs (EngineConfig.spec_probe_run) whose
steps after the first are launched ahead, and Tp(b) is the median of an engine's steady async probes only
(launched ahead and launching the step after ahead: spec_step_costs._pricing_probes), so X(b) carries what
running synchronously costs the speculative engine.

A machine's speed drifts (other tenants, clocks, what the batches hold), so each verification's
Tp, Ts and X are scaled to the speed around its time (speed_factors): the median, over the
LOCAL_PROBES probe steps nearest in time (and as many speculative steps as they span), of
each step's time over the median at its batch size.

Per task, over its joined verifications (tokens = accepted + 1 each):

    spec time   sum over pure-decode verifications of w x Ts(b), plus wm x the own time of every
                step that ran prefill chunks beside the verification (a "mixed" step)
    plain time  sum of (w x) tokens x Tp(b) (each token one plain step at its batch size), where
                for a mixed step one of them costs (wm x) M(P, b) instead: a plain engine runs the
                same prefill chunks, only its decode steps multiply

M(P, b) is what a plain mixed step with P prefill tokens beside b decoding requests takes: a plain
decode step at b and what the prefill chunks add, M = Tp(b) + max(0, e + p x P), e and p (>= 0)
fitted on the plain mixed probe steps' time less Tp(b) (spec_probe counts mixed steps apart:
runtime.speculative.spec_probe; the fit leaves out points beyond 3 robust standard deviations; a
first fit with a free term per decoding request was ill-posed, the decoding count barely varying
in mixed steps, and put one CPU run's plain mixed steps at 4x their time). It is measured, not derived from the
speculative step: on CUDA a plain pure-decode step is a graph replay and a mixed step eager, so
"the speculative mixed step less its draft phase and X(b)" put the plain mixed step at a third of
its measured time (H200, 2026-12-03). Records without mixed probes (an older engine) fall back to
max(step - draft phase - X(b), Tp(b)).

w = 1 + (probe steps / speculative pure-decode steps at b), wm = 1 + (mixed probe steps /
speculative mixed steps): the probe steps took the place of speculative ones, so an engine
without them verifies that much more often.
    predicted_speedup = plain time / spec time    (decode tokens/s with speculation / without)

With pure-decode steps only that is (tau / Ts) / (1 / Tp): tokens per speculative step over
its time, against one token per plain step over its time.

OPEN ARRIVALS. The plain time above prices a plain engine at the speculative engine's own schedule (what a
closed loop of clients gives it); open_arrivals_speedup prices it under open arrivals instead
(correlate.spec_open_arrivals). The records do not say which arrival process was served, so the interval spans
both figures.

speedup_low .. speedup_high is an approximate 95% interval: the lower of the two arrival figures x
exp(-2 sigma) to the higher x exp(+2 sigma), sigma from the sampling error of the medians (1.2533 x 1.4826
MAD / sqrt(n), the MAD relative to the median pooled over batch sizes, independent across batch
sizes), of tau, and MODEL_ERROR (MODEL_ERROR_CUDA for an engine on a GPU) for what the prediction
itself misses (see their comments for where the values come from). model_speedup is the textbook
figure (Leviathan et al., 2023) tau / (gamma c + 1), c = draft time per drafted token / plain
target forward, both measured; it leaves out the verify and sampling extra, so it is a model.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infersight.correlate.spec_step_costs import (  # noqa: F401  (ENGINE_ID_SHIFT, step_costs: re-exported)
    ENGINE_ID_SHIFT, _at_batch, _empty, mixed_costs, plain_mixed_ns, speed_factors, step_costs,
)
from infersight.correlate.spec_open_arrivals import open_arrivals_plain_time
from infersight.correlate.speculation import acceptance_by_task

#: Relative error of the prediction beyond the sampling error of its medians: what the prediction
#: leaves out (the batch mix of a run without probe steps, how admissions bunch into mixed steps, host
#: time between steps) plus the noise of the measurement it is checked against. Where the value comes
#: from: with plain mixed probes (this model), the RMS of log(predicted / measured) was 0.086 (mean
#: +0.004, largest 0.32; 62 of 64 measured speedups inside the printed interval) over 64 task runs of
#: `infersight bench speculation` (client-clock A/B) with seeds 101-108 at batch 4 and 8 on pinned
#: cores of the H200 host's CPU, 2026-12-04 (`bash benchmarks/gpu.sh speculation_recheck`, which runs
#: `benchmarks/spec_calibration.py --seeds 101-108 --batches 4 8`). The CI check
#: (tests/bench/speculation/test_spec_ab.py) runs seed 0, none of these. This term is the CPU's (MODEL_ERROR_CUDA
#: is CUDA's).
MODEL_ERROR = 0.086
#: The same term on CUDA, where the prediction misses more (a plain pure-decode step is a graph
#: replay and a mixed one eager, the host's time between steps is a larger share): the RMS of
#: log(predicted / measured) over 8 task runs of `infersight bench speculation --device cuda` on an
#: H100, seeds 4 and 5 at batch 4 and 16, 2026-12-05 22:4x UTC, tree 499d3c2 (`SPEC_CPU_CALIB=0
#: SPEC_RUNS="4_4_32 5_16_128" bash benchmarks/gpu.sh speculation_recheck`): mean +0.144 (predictions 15%
#: high), largest 0.33. Those were the first CUDA runs with both fixes of 2026-12-05 (plain probes in
#: launched-ahead runs, priced by their steady steps; async arms run one after another, not in turn);
#: the value it replaces (0.147, H200 seeds 4-5, 12-04) came from runs biased by both. Checked on other
#: seeds (the demo's load at seeds 0 and 1): BENCHMARKS.md. Not re-measured on the H200.
MODEL_ERROR_CUDA = 0.175

SPEEDUP_COLUMNS = {
    "task": "object", "verifications": "int64", "proposed": "int64", "accepted": "int64",
    "accept_rate": "float64", "mean_accepted_length": "float64", "gamma": "float64",
    "timed_verifications": "int64", "mixed_verifications": "int64", "probe_steps": "int64", "plain_samples": "int64",
    "mixed_probe_steps": "int64",
    "spec_steps": "int64", "mean_batch": "float64", "spec_step_ms": "float64", "plain_step_ms": "float64",
    "draft_ms_per_token": "float64", "verify_ms": "float64", "plain_forward_ms": "float64",
    "verify_extra_ms": "float64", "plain_mixed_ms": "float64", "predicted_speedup": "float64", "speedup_low": "float64",
    "speedup_high": "float64", "open_arrivals_speedup": "float64", "model_speedup": "float64",
    "model_error": "float64", "basis": "object",
}
#: basis values: how predicted_speedup was obtained
PREDICTED = "predicted_from_probe_steps"  # estimated from timed plain probe and speculative steps at the task's batch sizes
NO_PROBES = "no_plain_probe_steps"  # step timings but no plain step to compare with (spec_probe_every = 0)
NO_TIMING = "no_step_timing"        # verifications only (an engine that does not time its steps)


def join_steps(spec: pd.DataFrame, step_timing: pd.DataFrame) -> pd.DataFrame:
    """spec rows that fall in a timed speculative step, with that step's engine, batch (requests
    decoding), step_id, step_start_ns, pure (no prefill chunk beside), dur_ns, step_draft_ns and
    step_prefill_tokens."""
    steps = step_timing[~step_timing["spec_probe"]]
    if spec.empty or steps.empty:
        return spec.iloc[:0].assign(engine=np.int64(0), step_id=np.int64(0), step_start_ns=np.int64(0),
                                    batch=np.int64(0), pure=False, dur_ns=np.int64(0), step_draft_ns=np.int64(0),
                                    step_prefill_tokens=np.int64(0))
    left = spec.assign(engine=spec["request_id"].to_numpy(np.int64) >> ENGINE_ID_SHIFT).sort_values("ts_ns")
    right = pd.DataFrame({
        "engine": steps["step_id"].to_numpy(np.int64) >> ENGINE_ID_SHIFT, "step_id": steps["step_id"],
        "start_ns": steps["start_ns"],
        "end_ns": steps["end_ns"], "batch": steps["decode_requests"], "pure": steps["prefill_tokens"] == 0,
        "dur_ns": steps["end_ns"] - steps["start_ns"], "step_draft_ns": steps["draft_ns"],
        "step_prefill_tokens": steps["prefill_tokens"]}).sort_values("start_ns")
    joined = pd.merge_asof(left, right, left_on="ts_ns", right_on="start_ns", by="engine", direction="backward")
    joined = joined[joined["end_ns"].notna() & (joined["ts_ns"] <= joined["end_ns"])]
    return joined.drop(columns=["end_ns"]).rename(columns={"start_ns": "step_start_ns"}).astype(
        {"step_id": "int64", "step_start_ns": "int64", "batch": "int64", "pure": "bool", "dur_ns": "int64",
         "step_draft_ns": "int64", "step_prefill_tokens": "int64"})


def model_error(on_gpu: bool) -> float:
    """The model-error term for an engine on a GPU (MODEL_ERROR_CUDA) or on the CPU (MODEL_ERROR)."""
    return MODEL_ERROR_CUDA if on_gpu else MODEL_ERROR


def speedup_by_task(spec: pd.DataFrame, step_timing: pd.DataFrame, model_err: float = MODEL_ERROR) -> pd.DataFrame:
    """One row per task, sorted by task (columns SPEEDUP_COLUMNS): acceptance (verifications,
    proposed, accepted, accept_rate, mean_accepted_length = tau, gamma = mean proposed); the
    sample counts (timed_verifications joined to a step, mixed_verifications among them,
    probe_steps at the task's batch sizes, plain_samples those of them that price the plain step, spec_steps: the
    pure-decode steps it was verified in); the parts in ms, averaged over its
    pure-decode verifications (spec_step_ms Ts, plain_step_ms Tp, draft_ms_per_token,
    verify_ms, plain_forward_ms, verify_extra_ms X); predicted_speedup and model_speedup as in
    the module docstring; model_error (model_err: the term in the interval, model_error() by device);
    basis (PREDICTED, NO_PROBES or NO_TIMING; NaN speedups unless PREDICTED)."""
    if spec.empty:
        return _empty(SPEEDUP_COLUMNS)
    acc = acceptance_by_task(spec).set_index("task")
    costs = step_costs(step_timing)
    j = join_steps(spec, step_timing)
    eng, b = j["engine"].to_numpy(np.int64), j["batch"].to_numpy(np.float64)
    cols = {c: _at_batch(costs, eng, b, c) for c in ("plain_step_ns", "spec_step_ns", "verify_extra_ns",
                                                      "draft_ns_per_forward", "verify_ns", "plain_forward_ns")}
    exact = costs.set_index(["engine", "batch"])
    for c in ("probe_steps", "plain_samples", "spec_steps"):  # samples at exactly that batch size (0: none)
        cols[c] = np.array([exact[c].get(k, 0) for k in zip(eng.tolist(), j["batch"].tolist())], dtype=np.float64)
    # Relative standard error of one step time (1.2533 x 1.4826 MAD: a median's, times sqrt(n)),
    # the spread pooled over batch sizes.
    spread = {k: 1.2533 * 1.4826 * costs[f"{k}_rel_mad"].median() for k in ("plain", "spec")}
    j = j.assign(_tokens=j["accepted"] + 1, **{"_" + c: v for c, v in cols.items()})
    # The machine's speed drifts: scale each verification's figures to the speed around its time.
    plain_f, spec_f = speed_factors(step_timing, costs, eng, j["step_start_ns"].to_numpy(np.int64))
    less_draft = (j["_verify_extra_ns"] + j["_plain_step_ns"]) * spec_f
    j["_plain_step_ns"] *= plain_f
    j["_spec_step_ns"] *= spec_f
    j["_verify_extra_ns"] = less_draft - j["_plain_step_ns"]
    # What a plain mixed step adds to a plain decode step, from the plain mixed probes where the engine ran some
    # (else NaN: the fallback in spec_step_costs.plain_mixed_ns).
    mixed_model = mixed_costs(step_timing, costs).set_index("engine")
    m = mixed_model.reindex(eng)
    excess = ((m["extra_ns"].to_numpy() + m["prefill_ns_per_token"].to_numpy() * j["step_prefill_tokens"].to_numpy())
              * plain_f)
    j["_mixed_fitted"] = np.isfinite(excess)
    j["_plain_mixed_ns"] = plain_mixed_ns(j, j["_plain_step_ns"].to_numpy(), excess)
    # Probe steps took the place of speculative ones: without them a request would have had 1 + probes /
    # speculative steps (at its batch size, of its kind) as many verifications for the same prefills beside it.
    mixed_weight = 1.0 + (m["mixed_probes"] / m["spec_mixed_steps"].where(m["spec_mixed_steps"] > 0)).fillna(
        0.0).to_numpy()
    j["_weight"] = np.where(j["pure"], _displaced(j), mixed_weight)
    j["_mixed_resid"] = m["resid_rel"].to_numpy() / np.sqrt(m["mixed_probes"].to_numpy())
    open_plain = open_arrivals_plain_time(j, costs, plain_f, excess)
    rows = []
    for task in acc.index:
        g = j[j["task"] == task]
        pure, mixed = g[g["pure"]], g[~g["pure"]]
        tp = pure["_plain_step_ns"].mean()
        displaced, wm = pure["_weight"], mixed["_weight"]
        spec_time = (displaced * pure["_spec_step_ns"]).sum() + (wm * mixed["dur_ns"]).sum()
        mixed_plain = mixed["_plain_mixed_ns"]
        plain_time = ((displaced * pure["_tokens"] * pure["_plain_step_ns"]).sum()
                      + (wm * mixed["_tokens"] * mixed["_plain_step_ns"]).sum()
                      + (wm * (mixed_plain - mixed["_plain_step_ns"])).sum())
        batches = set(zip(pure["engine"], pure["batch"]))
        at = costs.loc[np.array([k in batches for k in zip(costs["engine"], costs["batch"])], dtype=bool)]
        basis = NO_TIMING if step_timing.empty else PREDICTED if np.isfinite(tp) and spec_time > 0 else NO_PROBES
        tau, gamma = acc.at[task, "mean_accepted_length"], acc.at[task, "gamma"]
        c = pure["_draft_ns_per_forward"].mean() / pure["_plain_forward_ns"].mean()
        speedup = plain_time / spec_time if basis == PREDICTED else np.nan
        open_speedup = open_plain.get(task, np.nan) / spec_time if basis == PREDICTED else np.nan
        # The interval spans both arrival processes (module docstring): either may be the one served.
        lowest = highest = speedup
        if np.isfinite(open_speedup):
            lowest, highest = min(speedup, open_speedup), max(speedup, open_speedup)
        # The same few medians serve every verification at a batch size: their errors add, not average out.
        # The fitted plain mixed step: its mean's error (residual spread / sqrt(probes)), by its share.
        fitted = mixed["_mixed_fitted"]
        mixed_error = (float((wm * mixed_plain)[fitted].sum() / plain_time * mixed["_mixed_resid"][fitted].mean())
                       if fitted.any() and plain_time > 0 else 0.0)
        sigma = np.sqrt(_median_error(pure, "_plain_step_ns", "_plain_samples", spread["plain"], weight="_tokens") ** 2
                        + _median_error(pure, "_spec_step_ns", "_spec_steps", spread["spec"]) ** 2
                        + np.nan_to_num(mixed_error) ** 2
                        + (g["_tokens"].std() / np.sqrt(len(g)) / g["_tokens"].mean()) ** 2 + model_err ** 2)
        rows.append({
            "task": task, "timed_verifications": len(g), "mixed_verifications": len(mixed),
            "probe_steps": int(at["probe_steps"].sum()), "plain_samples": int(at["plain_samples"].sum()),
            "spec_steps": int(pure["step_id"].nunique()),
            "mixed_probe_steps": int(mixed_model.loc[mixed_model.index.isin(g["engine"].unique()), "mixed_probes"].sum()),
            "plain_mixed_ms": mixed_plain.mean() / 1e6,
            "mean_batch": pure["batch"].mean(), "spec_step_ms": pure["_spec_step_ns"].mean() / 1e6,
            "plain_step_ms": tp / 1e6, "draft_ms_per_token": pure["_draft_ns_per_forward"].mean() / 1e6,
            "verify_ms": pure["_verify_ns"].mean() / 1e6, "plain_forward_ms": pure["_plain_forward_ns"].mean() / 1e6,
            "verify_extra_ms": pure["_verify_extra_ns"].mean() / 1e6,
            "predicted_speedup": speedup, "speedup_low": lowest * np.exp(-2 * sigma),
            "speedup_high": highest * np.exp(2 * sigma), "open_arrivals_speedup": open_speedup,
            "model_speedup": tau / (gamma * c + 1.0) if basis == PREDICTED else np.nan, "model_error": model_err,
            "basis": basis})
    out = acc.reset_index().merge(pd.DataFrame(rows), on="task")
    return out[list(SPEEDUP_COLUMNS)].astype(SPEEDUP_COLUMNS)


def _displaced(pure: pd.DataFrame) -> pd.Series:
    """1 + probe steps / speculative steps at each verification's batch size; 1 where no speculative step there
    is a sample (every one moved KV, say: the verification is priced at an interpolated Ts, and how many probes
    took the place of such steps is unknown). Before: 1 + n / 0, and every task's prediction NaN (CPU demo load,
    seed 2, 2026-12-05)."""
    n = pure["_spec_steps"]
    return 1.0 + (pure["_probe_steps"] / n.where(n > 0)).fillna(0.0)


def _median_error(pure: pd.DataFrame, value: str, count: str, spread: float, weight: str | None = None) -> float:
    """Relative standard error of sum(weight x value) over a task's pure-decode verifications when
    each batch size's value is a median of `count` samples, independent across batch sizes (a batch
    size without a sample of its own, interpolated, counts as one)."""
    w = pure[value] * (pure[weight] if weight else 1.0)
    by_b = pd.DataFrame({"w": w, "n": np.maximum(pure[count], 1.0), "engine": pure["engine"], "batch": pure["batch"]})
    per = by_b.groupby(["engine", "batch"]).agg(w=("w", "sum"), n=("n", "first"))
    total = float(per["w"].sum())
    if not np.isfinite(total) or total == 0.0:  # nothing timed yet: the error is unknown, not 0/0
        return float("nan")
    return float(spread * np.sqrt((per["w"] ** 2 / per["n"]).sum()) / total)


def summary_by_task(by_task: pd.DataFrame) -> dict[str, dict[str, object]]:
    """speedup_by_task as JSON-ready dicts keyed by task, each saying how its figures were obtained."""
    out: dict[str, dict[str, object]] = {}
    for r in by_task.itertuples(index=False):
        if r.basis == PREDICTED:
            probes = (f"{r.probe_steps} plain probe steps" if r.plain_samples == r.probe_steps else
                      f"{r.plain_samples} steady async plain probe steps (of {r.probe_steps}: under async scheduling "
                      f"the middle steps of a probe run price the plain step)")
            how = (f"predicted, not measured: estimated from {probes} (the nearest in time "
                   f"to each verification) and the median speculative pure-decode step around each of its "
                   f"{r.spec_steps} steps, at the same batch sizes (mean {r.mean_batch:.1f}): "
                   f"{r.mean_accepted_length:.2f} tokens per verification (mean of {r.verifications}) against 1 "
                   f"token per plain step; {r.mixed_verifications} verifications in steps with prefill chunks count "
                   f"at those steps' own time, against "
                   + (f"a plain mixed step fitted on {r.mixed_probe_steps} plain mixed probe steps"
                      if r.mixed_probe_steps else "those steps less their draft phase and verify extra (no plain "
                                                  "mixed probe step to fit on)")
                   + "; steps "
                   f"that captured a CUDA graph are left out; the interval is ~95% from the spread of the step "
                   f"times and of tau, "
                   + (f"spanning the figure for a closed loop ({r.predicted_speedup:.2f}x) and for open arrivals "
                      f"({r.open_arrivals_speedup:.2f}x: a plain engine at its own batch, meeting prefills in "
                      f"proportion to its requests' lifetime), " if np.isfinite(r.open_arrivals_speedup) else "")
                   + f"and a {r.model_error:.1%} model error calibrated against measured A/B runs "
                   f"({'CUDA' if r.model_error == MODEL_ERROR_CUDA else 'CPU'} runs). "
                   f"`infersight bench speculation` measures the speedup")
        elif r.basis == NO_PROBES:
            how = ("not predicted: no plain decode step at this task's batch sizes to compare with "
                   "(run the engine with spec_probe_every, e.g. 16)")
        else:
            how = "not predicted: the engine does not time its steps (acceptance only)"
        out[str(r.task)] = {
            "accept_rate": r.accept_rate, "mean_accepted_length": r.mean_accepted_length, "gamma": r.gamma,
            "predicted_speedup": r.predicted_speedup, "speedup_interval": [r.speedup_low, r.speedup_high],
            "open_arrivals_speedup": r.open_arrivals_speedup,
            "model_error": r.model_error, "basis": r.basis, "how": how,
            "parts_ms": {"spec_step": r.spec_step_ms, "plain_step": r.plain_step_ms,
                         "draft_per_token": r.draft_ms_per_token, "verify_forward": r.verify_ms,
                         "plain_forward": r.plain_forward_ms, "verify_extra": r.verify_extra_ms,
                         "plain_mixed_step": r.plain_mixed_ms},
            "samples": {"verifications": r.verifications, "timed_verifications": r.timed_verifications,
                        "mixed_verifications": r.mixed_verifications, "spec_steps": r.spec_steps,
                        "probe_steps": r.probe_steps, "plain_samples": r.plain_samples,
                        "mixed_probe_steps": r.mixed_probe_steps},
            "model_speedup": r.model_speedup,
            "model": "tau / (gamma * c + 1), c = draft time per token / plain target forward (Leviathan et al.): "
                     "a model that leaves out the verify and sampling extra",
        }
    return out
