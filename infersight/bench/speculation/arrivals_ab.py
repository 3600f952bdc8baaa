"""`infersight bench speculation --demo-workload`: the demo's own speculation predictions against an A/B of
the demo's own workload, measured with the client's clock.

`bench speculation` times each task alone at a fixed batch; the demo predicts for its own load: every task
mixed in one batch, Poisson arrivals with bursts, a small KV pool that preempts and swaps. A prediction for
one workload checked against a measurement of another agrees only where the two mixes agree (on the H200,
2026-12-04, the demo's creative prediction missed the bench's measurement for that reason: its speculative
steps were 17% mixed against the bench's 12%). Here three engines built from the demo's engine config run
the demo's workload, stepped in turn in one process (one after another where they schedule asynchronously,
CUDA's default: fixed_batch.step_runs), each fed by the workload's arrival times on its own clock
(bench.speculation.arrival_run):

    plain      no draft model                               measured (client's clock)
    spec       the demo's draft, no probe steps              measured (client's clock)
    probed     the demo's engine as it runs (its probe       predicted: the agent's spec_speedup over its
               rate), its records read from a probe ring    records (a prediction, as the demo prints it)

With observed_arms (`--observed-arms`) two more, each carrying a ProbeObserver as the probed engine does (its
own ring, read after every turn as the probed one is): plain_observed and spec_observed, measured the same way
(`{task}.measured_speedup_observed`): the A/B of the engines a user runs with infersight attached, beside the
A/B of bare engines. On an H100 (2026-12-05) the observer's expert counts alone cost a small MoE step 23-43%
(BENCHMARKS.md): the bare A/B and the prediction, made from an observed engine, need not agree.
The observed arms' records also give their steps' parts (`schedule_ns`, `target_ns`) beside the probe steps'.

Measured per task and round: decode tokens/s of `spec` over `plain` (every request's tokens after its
first over the client's time around the steps it decoded in, summed over the task's requests), the median
over rounds reported with the rounds. Both arms serve the same requests greedily: the same output tokens
(checked). verdict and `inside` as in bench.speculation.fixed_batch_ab. Also per arm: TTFT p50 and the makespan on each
run's clock (measured), which include queueing: an engine slower than the arrivals queues more.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from infersight.bench.speculation.arrival_run import ArrivalRun
from infersight.bench.speculation.fixed_batch import step_runs
from infersight.bench.speculation.fixed_batch_ab import RingRecords, rounded, spec_verdict
from infersight.correlate import spec_advice, spec_speedup
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import Engine, EngineConfig
from infersight.workload import TASKS, WorkloadRequest

ARMS = ("plain", "spec", "probed")
OBSERVED_ARMS = ("plain_observed", "spec_observed")  # with observed_arms (module docstring)


def _run_in_turn(engines: dict[str, Engine], workload: list[WorkloadRequest], turn0: int,
                 after_turn: Any) -> dict[str, ArrivalRun]:
    runs = {name: ArrivalRun(e, workload) for name, e in engines.items()}
    step_runs(runs.values(), turn0, after_turn)
    return runs


def _write_frames(folder: Path, frames: Any, runs: list[dict[str, ArrivalRun]],
                  observed: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    frames.spec.to_parquet(folder / "spec.parquet")
    frames.step_timing.to_parquet(folder / "step_timing.parquet")
    for arm, arm_frames in observed.items():
        arm_frames.step_timing.to_parquet(folder / f"{arm}_step_timing.parquet")
    steps = [r[arm].kinds.table().assign(arm=arm, round=i) for i, r in enumerate(runs) for arm in r]
    pd.concat(steps, ignore_index=True).to_parquet(folder / "steps.parquet")


def _observer(arm: str) -> ProbeObserver:
    return ProbeObserver(ProbeConfig(ring_name=f"infersight-bench-arrivals-{arm}-{time.monotonic_ns()}",
                                     task_labels=TASKS, nvtx=False))


def bench_speculation_on_arrivals(config: EngineConfig, workload: list[WorkloadRequest], rounds: int = 2,
                                  warmup_requests: int = 8, frames_out: str | None = None,
                                  observed_arms: bool = False) -> dict[str, Any]:
    """config: the predicting engine's (the demo's: its draft and spec_probe_every); the plain and spec arms
    are it without the draft, and without probe steps. Returns the flat result (module docstring).

    frames_out: a folder for what the figures came from, to check a prediction offline: the probed engine's
    records as the agent's frames (spec.parquet, step_timing.parquet) and every arm's steps in every round
    (steps.parquet: arm, round, kind, batch, engine_ns, client_ns; StepKinds.table); with observed_arms also
    their records' step_timing ({arm}_step_timing.parquet)."""
    if rounds < 1 or not config.speculative_model or config.spec_probe_every < 2:
        raise ValueError("need rounds >= 1 and a config with a draft model and spec_probe_every >= 2")
    started = time.perf_counter()
    probe = _observer("probed")
    observers = {arm: _observer(arm) for arm in (OBSERVED_ARMS if observed_arms else ())}
    consumers = {arm: RingConsumer.attach(o.ring_name, record_registry())
                 for arm, o in {"probed": probe, **observers}.items()}
    try:
        plain_config, spec_config = replace(config, speculative_model=None, spec_probe_every=0), replace(
            config, spec_probe_every=0)
        engines = {"plain": Engine(plain_config), "spec": Engine(spec_config), "probed": Engine(config, probe)}
        if observed_arms:
            engines |= {"plain_observed": Engine(plain_config, observers["plain_observed"]),
                        "spec_observed": Engine(spec_config, observers["spec_observed"])}
        for engine in engines.values():
            engine.capture_decode_graphs()  # on CUDA: no measured step pays a capture (as the demo warms up)
        records = {arm: RingRecords(c) for arm, c in consumers.items()}

        def read_all() -> None:
            for r in records.values():
                r.read()

        # Warm-up, not measured: first-use costs of the shapes the first requests meet, all at once.
        _run_in_turn(engines, [replace(r, arrival_s=0.0) for r in workload[:warmup_requests]], 0, read_all)
        for r in records.values():
            r.parts.clear()
        runs = [_run_in_turn(engines, workload, i, read_all) for i in range(rounds)]
        frames = records["probed"].frames()
        observed_frames = {arm: records[arm].frames() for arm in observers}
        if frames_out:
            _write_frames(Path(frames_out), frames, runs, observed_frames)
        dropped = consumers["probed"].stats()["dropped"]  # the records the prediction is made from
        dropped_observed = sum(consumers[arm].stats()["dropped"] for arm in observers)
        on_gpu = config.device.startswith("cuda")
        by_task = spec_speedup.speedup_by_task(frames.spec, frames.step_timing, spec_speedup.model_error(on_gpu))
        advice = {str(a["task"]): a for a in spec_advice.recommendations(by_task)}
        probes = engines["probed"].spec_probe
    finally:
        for c in consumers.values():
            c.close()
        for o in (probe, *observers.values()):
            o.close()
    result: dict[str, Any] = {
        "workload": f"{len(workload)} requests, arrivals over {workload[-1].arrival_s:.1f} s, max_tokens "
                    f"{max(r.max_tokens for r in workload)}", "device": config.device, "dtype": str(config.dtype),
        "num_kv_blocks": config.num_kv_blocks, "cpu_offload_blocks": config.cpu_offload_blocks,
        "max_num_seqs": config.max_num_seqs, "probe_every": config.spec_probe_every, "rounds": rounds,
        "probe_steps": probes.num_probes, "mixed_probe_steps": probes.num_mixed_probes, "dropped": dropped,
        "model_error": spec_speedup.model_error(on_gpu)}
    for arm in runs[0]:
        result[f"{arm}.makespan_s"] = [round(r[arm].clock_ns / 1e9, 3) for r in runs]
        ttft = [t for r in runs for ts in r[arm].ttft_ns.values() for t in ts]
        result[f"{arm}.ttft_p50_s"] = round(statistics.median(ttft) / 1e9, 4) if ttft else None
        result[f"{arm}.steps_by_kind"] = runs[-1][arm].kinds.summary()
    verdicts, inside, inside_observed = [], 0, 0
    for row in by_task.itertuples(index=False):
        task = str(row.task)
        if task not in runs[0]["plain"].tally:
            continue
        for r in runs:
            served = {arm: r[arm].tally[task].tokens for arm in r if arm != "probed"}
            if len(set(served.values())) != 1:
                raise RuntimeError(f"{task}: the arms served different work (decode tokens {served})")
        ratios = [r["spec"].tally[task].client_tokens_per_s / r["plain"].tally[task].client_tokens_per_s for r in runs]
        measured = statistics.median(ratios)
        low, high = float(row.speedup_low), float(row.speedup_high)
        verdicts.append(verdict := spec_verdict((low, high), ratios))
        inside += bool(low <= measured <= high)
        result |= {
            f"{task}.measured_speedup": rounded(measured),
            f"{task}.measured_rounds": [round(x, 4) for x in ratios],
            f"{task}.predicted_speedup": rounded(float(row.predicted_speedup)),
            f"{task}.predicted_interval": [rounded(low), rounded(high)],
            f"{task}.open_arrivals_speedup": rounded(float(row.open_arrivals_speedup)),
            f"{task}.inside": bool(low <= measured <= high),
            f"{task}.tau": rounded(float(row.mean_accepted_length)),
            f"{task}.samples": f"predicted from {row.verifications} verifications, {row.spec_steps} speculative and "
                               f"{row.probe_steps} plain probe steps",
            f"{task}.advice": advice.get(task, {}).get("action", "none"),
            f"{task}.verdict": verdict,
            **{f"{task}.{arm}_ttft_p50_s": rounded(statistics.median(
                [t for r in runs for t in r[arm].ttft_ns[task]]) / 1e9) for arm in ("plain", "spec")},
        }
        if observed_arms:
            seen = [r["spec_observed"].tally[task].client_tokens_per_s
                    / r["plain_observed"].tally[task].client_tokens_per_s for r in runs]
            result |= {f"{task}.measured_speedup_observed": rounded(statistics.median(seen)),
                       f"{task}.measured_rounds_observed": [round(x, 4) for x in seen],
                       f"{task}.inside_observed": bool(low <= statistics.median(seen) <= high)}
            inside_observed += bool(low <= statistics.median(seen) <= high)
    result |= {"measured_by": "the client's clock (perf_counter around each engine step call) on each run's own "
                              "clock of arrivals: decode tokens/s over every request's first-to-last-token time",
               "predicted_by": "the agent's spec_speedup over the probed engine's records (a prediction)",
               "tasks_agree": verdicts.count("agrees"), "tasks_contradict": verdicts.count("contradicts"),
               "tasks_inside": inside, "tasks": len(verdicts), "wall_s": round(time.perf_counter() - started, 1),
               **({"tasks_inside_observed": inside_observed, "dropped_observed_arms": dropped_observed}
                  if observed_arms else {})}
    return result
