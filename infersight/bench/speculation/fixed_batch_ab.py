"""`infersight bench speculation`: the speedup speculation really gives, per task, measured with
the client's wall clock, against the speedup the agent predicts from its probe records.

Three engines of one process run the same task-labelled requests (infersight.workload), one
task at a time at a fixed batch size (bench.speculation.fixed_batch), stepped in turn so that drift in the
machine's speed hits them alike; where an engine schedules asynchronously (CUDA's default) one after another,
who goes first rotating with the round (fixed_batch.step_runs says why). Output lengths differ (spread over 1/2 .. 3/2 of max_tokens), so
requests finish at different steps with or without speculation, as in service: with one length
for all, a plain batch would finish and refill in lockstep, its prefills never beside decodes.

    plain      no draft model                                  measured (client's wall clock)
    spec       the draft, gamma drafts per step                measured (client's wall clock)
    probed     the draft and spec_probe_every: plain probe     predicted, through the agent's own
               steps, its records read from a probe ring       correlate functions (spec_speedup,
                                                               spec_advice)

    spec@G     the draft, G drafts per step, for each G in    measured: is another gamma faster?
               `gammas`                                        (best_gamma, from measurement only)

Measured speedup per task: decode tokens/s of `spec` over `plain` as a streaming client sees them,
over the whole run: every request's tokens after its first over its first-to-last-token time by
the client's clock (time.perf_counter_ns around each engine step call it decoded in, summed;
FixedBatchRun), the engine's own step timestamps not used. The same prompts, greedy: both arms
produce the same output tokens (checked). This is the quantity spec_speedup predicts: speculation
changes decode, and each request's prefill is the same work in both arms. One ratio per round;
reported: the median over the rounds, their range, and the noise (largest deviation of a round
from the median). Reported beside it, measured too: `makespan_speedup`, the client's wall time to
serve all of the task's requests, plain over spec (prefills included: nearer 1 by their share),
and `engine_clock_speedup` (the engine's step timestamps; for diagnosis). The prediction pools the probed engine's records of every
round, as the agent would. A first pass over `batch` requests of each task warms every engine up
and is not counted.

verdict per task: "agrees" when the predicted interval and every round lie on the same side of 1,
"contradicts" when they lie on opposite sides, else "inconclusive" (one of them holds 1).
`inside` says whether the measured median lies in the predicted interval.
"""
from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from infersight.bench.speculation.fixed_batch import FixedBatchRun, StepKinds, step_runs
from infersight.correlate import spec_advice, spec_speedup
from infersight.correlate.frames import EventFrames, update_labels
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import Engine, EngineConfig
from infersight.runtime.config import resolve_dtype
from infersight.workload import TASKS, WorkloadConfig, WorkloadRequest, build_workload

#: The goal: predicted within this share of measured, per task.
TOLERANCE = 0.15
GOLDEN = 0.6180339887


def _engine(model: str, draft: str | None, gamma: int, probe_every: int, device: str, batch: int,
            observer: ProbeObserver | None = None, dtype: str = "auto", async_scheduling: bool = False,
            num_kv_blocks: int | None = None, cpu_offload_blocks: int = 0) -> Engine:
    # An ample pool by default: no preemption, so decode time is decode and nothing else (num_kv_blocks
    # and cpu_offload_blocks: another pool, e.g. the demo's, to time an engine under its KV pressure).
    # Synchronous scheduling unless asked: an engine with a draft runs synchronously, and so do its
    # plain probe steps, so the plain arm is timed as the probes are (plain-async is reported beside it on CUDA).
    config = EngineConfig(model=model, speculative_model=draft, num_speculative_tokens=gamma, device=device,
                          max_num_seqs=batch, max_num_batched_tokens=512, spec_probe_every=probe_every,
                          num_kv_blocks=num_kv_blocks or (batch + 1) * 32, cpu_offload_blocks=cpu_offload_blocks,
                          dtype=resolve_dtype(dtype, device), async_scheduling=async_scheduling)
    engine = Engine(config, observer)
    engine.capture_decode_graphs()  # on CUDA: no step of the measured runs pays a capture
    return engine


class RingRecords:
    """Everything read from the probe ring, decoded once at the end."""

    def __init__(self, consumer: RingConsumer) -> None:
        self.consumer = consumer
        self.parts: dict[int, list[np.ndarray]] = defaultdict(list)
        self.labels: dict[int, str] = {0: "other"}

    def read(self) -> None:
        records = self.consumer.read()
        self.labels = update_labels(self.labels, records)
        for kind, rec in records.items():
            self.parts[kind].append(rec)

    def frames(self) -> EventFrames:
        self.read()
        return EventFrames.from_records({k: np.concatenate(v) for k, v in self.parts.items()}, self.labels)


@dataclass
class Measured:
    """Per engine name, task: one entry per round."""

    client_rates: dict[str, dict[str, list[float]]]        # decode tokens/s by the client's clock
    wall_s: dict[str, dict[str, list[float]]]              # the client's wall time to serve the task's requests
    engine_rates: dict[str, dict[str, list[float]]]        # decode tokens/s by the engine's step clock
    output_tokens: dict[str, dict[str, list[int]]]         # tokens the client received
    step_kinds: dict[str, dict[str, StepKinds]] = field(default_factory=dict)  # every round's steps by kind


def _measure(engines: dict[str, Engine], workload: list[WorkloadRequest], tasks: list[str], batch: int,
             rounds: int, after_turn: Callable[[], None]) -> Measured:
    """Each task's requests at a fixed batch on every engine, the engines stepped in turn (who goes
    first rotates), or one after another where one schedules asynchronously (step_runs; who goes first
    rotates with the round), timed by the client's clock (FixedBatchRun.wall_ns)."""
    m = Measured(*({name: defaultdict(list) for name in engines} for _ in range(4)))
    for i in range(rounds):
        for task in tasks:
            listed = [r for r in workload if r.task == task]
            runs = {name: FixedBatchRun(e, listed, batch) for name, e in engines.items()}
            step_runs(runs.values(), i, after_turn)
            for name, run in runs.items():
                m.step_kinds.setdefault(name, {}).setdefault(task, StepKinds()).extend(run.kinds)
                m.client_rates[name][task].append(run.tally[task].client_tokens_per_s)
                m.wall_s[name][task].append(run.wall_ns / 1e9)
                m.engine_rates[name][task].append(run.tally[task].tokens_per_s)
                m.output_tokens[name][task].append(run.output_tokens)
    return m


def bench_speculation(model: str = "tiny-moe", draft: str = "tiny-draft", gamma: int = 4, requests: int = 32,
                      batch: int = 4, rounds: int = 3, probe_every: int = 4, max_tokens: int = 48,
                      device: str = "cpu", threads: int | None = 1, seed: int = 0,
                      gammas: tuple[int, ...] = (), dtype: str = "auto", frames_out: str | None = None,
                      num_kv_blocks: int | None = None, cpu_offload_blocks: int = 0) -> dict[str, Any]:
    """Run the comparison; returns the flat result (see the module docstring). gammas: other draft
    lengths to measure beside `gamma` (their engines join the same lockstep). frames_out: a folder
    to write the probed engine's spec and step_timing frames to (parquet), and every engine's measured steps
    (steps.parquet: arm, task, kind, batch, engine_ns, client_ns; StepKinds.table), so that the prediction
    can be studied offline against this run's measurement. num_kv_blocks, cpu_offload_blocks: every
    engine's KV pool (default: ample, (batch + 1) x 32 blocks, no CPU tier)."""
    if rounds < 1 or batch < 1 or probe_every < 2:
        raise ValueError(f"need rounds >= 1, batch >= 1 and probe_every >= 2 (got {rounds}, {batch}, {probe_every})")
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)  # a shared machine: oversubscribed threads make noise, not speed
    started = time.perf_counter()
    # Lengths spread over 1/2 .. 3/2 of max_tokens (golden-ratio steps: no two alike): see the docstring.
    workload = [replace(r, max_tokens=max(2, round(max_tokens * (0.5 + (i * GOLDEN) % 1.0))))
                for i, r in enumerate(build_workload(WorkloadConfig(num_requests=requests, max_tokens=max_tokens,
                                                                    seed=seed)))]
    tasks = [t for t in TASKS if any(r.task == t for r in workload)]
    probe = ProbeObserver(ProbeConfig(ring_name=f"infersight-bench-spec-{time.monotonic_ns()}", task_labels=TASKS,
                                      nvtx=False))
    consumer = RingConsumer.attach(probe.ring_name, record_registry())
    try:
        def make(draft_model: str | None, g: int, every: int, observer: ProbeObserver | None = None,
                 async_scheduling: bool = False) -> Engine:
            return _engine(model, draft_model, g, every, device, batch, observer, dtype, async_scheduling,
                           num_kv_blocks, cpu_offload_blocks)

        plain = make(None, gamma, 0)
        probed = make(draft, gamma, probe_every, probe)
        engines = {"plain": plain, "spec": make(draft, gamma, 0), "probed": probed,
                   **{f"spec@{g}": make(draft, g, 0) for g in gammas if g != gamma}}
        if device.startswith("cuda"):  # what a plain CUDA engine runs by default: async scheduling
            engines["plain-async"] = make(None, gamma, 0, async_scheduling=True)
        records = RingRecords(consumer)
        # Warm-up, not measured: first-use costs (allocations, kernel compiles) of every shape. On CUDA
        # the whole workload once: Triton compiles a kernel per verify shape met, and a first round
        # warmed on `batch` requests per task ran up to 3x slower on the speculative side (2026-12-03).
        warm = workload if device.startswith("cuda") else [
            r for t in tasks for r in [w for w in workload if w.task == t][:batch]]
        _measure(engines, warm, tasks, batch, 1, records.read)
        records.parts.clear()  # the task labels it announced are kept
        measured_runs = _measure(engines, workload, tasks, batch, rounds, records.read)
        frames = records.frames()
        if frames_out:
            Path(frames_out).mkdir(parents=True, exist_ok=True)
            frames.spec.to_parquet(Path(frames_out) / "spec.parquet")
            frames.step_timing.to_parquet(Path(frames_out) / "step_timing.parquet")
            # every engine's measured steps, as the client timed them: the prediction's step prices can then be
            # set beside the arms' own (which part of a miss is the price, which the load)
            pd.concat([kinds.table().assign(arm=name, task=task) for name, by_task in measured_runs.step_kinds.items()
                       for task, kinds in by_task.items()], ignore_index=True).to_parquet(Path(frames_out) / "steps.parquet")
        dropped = consumer.stats()["dropped"]
        probes = probed.spec_probe
        by_task = spec_speedup.speedup_by_task(frames.spec, frames.step_timing,
                                                 spec_speedup.model_error(device.startswith("cuda")))
        advice = {str(a["task"]): a for a in spec_advice.recommendations(by_task)}
    finally:
        consumer.close()
        probe.close()
        torch.set_num_threads(old_threads)
    result: dict[str, Any] = {
        "model": model, "draft": draft, "gamma": gamma, "device": device, "dtype": dtype, "seed": seed,
        "threads": threads or old_threads, "model_error": spec_speedup.model_error(device.startswith("cuda")),
        "requests": requests, "batch": batch, "num_kv_blocks": num_kv_blocks or (batch + 1) * 32,
        "cpu_offload_blocks": cpu_offload_blocks, "rounds": rounds, "max_tokens": max_tokens, "probe_every": probe_every, "probe_steps": probes.num_probes,
        "mixed_probe_steps": probes.num_mixed_probes,
        "probe_share": round(probes.num_probes / max(1, sum(probes.decode_steps_at.values())
                                                     + sum(probes.mixed_steps_at.values())), 4),
        "dropped": dropped}
    verdicts = []
    within = inside = 0
    wall, rates, client = measured_runs.wall_s, measured_runs.engine_rates, measured_runs.client_rates
    for row in by_task.itertuples(index=False):
        task = str(row.task)
        if task not in wall["plain"]:
            continue
        if measured_runs.output_tokens["plain"][task] != measured_runs.output_tokens["spec"][task]:
            raise RuntimeError(f"{task}: the arms served different work "
                               f"({measured_runs.output_tokens['plain'][task]} vs {measured_runs.output_tokens['spec'][task]} tokens)")
        ratios = [s / p for s, p in zip(client["spec"][task], client["plain"][task])]
        makespan = [p / s for p, s in zip(wall["plain"][task], wall["spec"][task])]
        measured = statistics.median(ratios)
        predicted = float(row.predicted_speedup)
        low, high = float(row.speedup_low), float(row.speedup_high)
        error = predicted / measured - 1.0
        verdicts.append(verdict := spec_verdict((low, high), ratios))
        within += bool(abs(error) <= TOLERANCE)
        inside += bool(low <= measured <= high)
        engine_clock = [s / p for s, p in zip(rates["spec"][task], rates["plain"][task])]
        result |= {
            f"{task}.measured_speedup": rounded(measured),
            f"{task}.measured_rounds": [round(x, 4) for x in ratios],
            f"{task}.noise": round(max(abs(x / measured - 1.0) for x in ratios), 4),
            f"{task}.plain_wall_s": round(statistics.median(wall["plain"][task]), 4),
            f"{task}.spec_wall_s": round(statistics.median(wall["spec"][task]), 4),
            f"{task}.output_tokens": measured_runs.output_tokens["plain"][task][0],
            f"{task}.engine_clock_speedup": rounded(statistics.median(engine_clock)),
            f"{task}.makespan_speedup": rounded(statistics.median(makespan)),
            **({f"{task}.measured_speedup_vs_async_plain": rounded(statistics.median(
                [s / p for s, p in zip(client["spec"][task], client["plain-async"][task])]))}
               if "plain-async" in client else {}),
            f"{task}.predicted_speedup": rounded(predicted),
            f"{task}.predicted_interval": [rounded(low), rounded(high)],
            f"{task}.inside": bool(low <= measured <= high),
            f"{task}.error": rounded(error),
            f"{task}.model_speedup": rounded(float(row.model_speedup)),
            f"{task}.tau": rounded(float(row.mean_accepted_length)),
            f"{task}.samples": f"predicted from {row.verifications} verifications, {row.spec_steps} speculative and "
                               f"{row.probe_steps} plain probe steps",
            f"{task}.advice": advice.get(task, {}).get("action", "none"),
            **_other_gammas(task, gamma, measured, client),
            f"{task}.verdict": verdict,
            f"{task}.steps_by_kind": {name: kinds[task].summary() for name, kinds in measured_runs.step_kinds.items()
                                      if task in kinds},
        }
    result |= {"measured_by": "the client's clock (perf_counter around each engine step call): decode tokens/s "
                              "over every request's first-to-last-token time, whole run",
               "predicted_by": "the agent's spec_speedup over the probed engine's records (a prediction)",
               "tasks_agree": verdicts.count("agrees"), "tasks_contradict": verdicts.count("contradicts"),
               "tasks_inside": inside, "tasks_within_15pct": within, "tasks": len(wall["plain"]),
               "wall_s": round(time.perf_counter() - started, 1)}
    return result


def _side(low: float, high: float) -> int:
    """+1 all at or above 1, -1 all below 1, 0 holding 1."""
    return 1 if low >= 1.0 else -1 if high < 1.0 else 0


def spec_verdict(predicted: tuple[float, float], rounds: list[float]) -> str:
    p, m = _side(*predicted), _side(min(rounds), max(rounds))
    return "inconclusive" if p * m == 0 else "agrees" if p == m else "contradicts"


def rounded(x: float) -> float | None:
    """Rounded for printing; None (JSON null) when not finite (nothing predicted)."""
    return round(x, 4) if math.isfinite(x) else None


def _other_gammas(task: str, gamma: int, measured: float, client: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Measured speedup at each other gamma, and the best gamma by measurement (the running one
    unless another is faster in every round)."""
    out: dict[str, Any] = {}
    best, best_s = gamma, measured
    spec_rounds = [s / p for s, p in zip(client["spec"][task], client["plain"][task])]
    for name in sorted(n for n in client if n.startswith("spec@")):
        g = int(name.split("@")[1])
        ratios = [s / p for s, p in zip(client[name][task], client["plain"][task])]
        out[f"{task}.measured_speedup_gamma_{g}"] = rounded(statistics.median(ratios))
        if all(x > y for x, y in zip(ratios, spec_rounds)) and statistics.median(ratios) > best_s:
            best, best_s = g, statistics.median(ratios)
    if out:
        out[f"{task}.best_gamma"] = best
    return out
