"""`infersight bench speculation`: the speedup speculation really gives, per task, against the
speedup the agent predicts from its probe records.

Three engines of one process run the same task-labelled requests (infersight.workload), one
task at a time at a fixed batch size (bench.fixed_batch), stepped in turn so that drift in the
machine's speed hits them alike. Output lengths differ (spread over 1/2 .. 3/2 of max_tokens), so
requests finish at different steps with or without speculation, as in service: with one length
for all, a plain batch would finish and refill in lockstep, its prefills never beside decodes.

    plain      no draft model                                  measured
    spec       the draft, gamma drafts per step                measured
    probed     the draft and spec_probe_every: plain probe     predicted, through the agent's own
               steps, its records read from a probe ring       correlate functions (spec_speedup,
                                                               spec_advice)

    spec@G     the draft, G drafts per step, for each G in    measured: is another gamma faster?
               `gammas`                                        (best_gamma, from measurement only)

Measured speedup per task: decode tokens/s of `spec` over `plain` (decode tokens and the engine
time of the steps each request decoded in), one ratio per round; reported: the median over the
rounds, their range, and the noise (largest deviation of a round from the median). The
prediction pools the probed engine's records of every round, as the agent would. A first pass
over `batch` requests of each task warms every engine up and is not counted.

verdict per task: "agrees" when the predicted interval and every round lie on the same side of 1,
"contradicts" when they lie on opposite sides, else "inconclusive" (one of them holds 1).
"""
from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import torch

from infersight.bench.fixed_batch import FixedBatchRun
from infersight.correlate import spec_advice, spec_speedup
from infersight.correlate.frames import EventFrames, update_labels
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import Engine, EngineConfig
from infersight.workload import TASKS, WorkloadConfig, WorkloadRequest, build_workload

#: The goal: predicted within this share of measured, per task.
TOLERANCE = 0.15
GOLDEN = 0.6180339887


def _engine(model: str, draft: str | None, gamma: int, probe_every: int, device: str, batch: int,
            observer: ProbeObserver | None = None) -> Engine:
    # An ample pool: no preemption, so decode time is decode and nothing else.
    config = EngineConfig(model=model, speculative_model=draft, num_speculative_tokens=gamma, device=device,
                          max_num_seqs=batch, max_num_batched_tokens=512, spec_probe_every=probe_every,
                          num_kv_blocks=(batch + 1) * 32)
    return Engine(config, observer)


class _Records:
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


def _measure(engines: dict[str, Engine], workload: list[WorkloadRequest], tasks: list[str], batch: int,
             rounds: int, after_turn: Callable[[], None]) -> dict[str, dict[str, list[float]]]:
    """Decode tokens/s per engine, task and round: each task's requests at a fixed batch, the
    engines stepped in turn (who goes first rotates)."""
    rates: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in engines}
    for _ in range(rounds):
        for task in tasks:
            listed = [r for r in workload if r.task == task]
            runs = {name: FixedBatchRun(e, listed, batch) for name, e in engines.items()}
            order = list(runs.values())
            turn = 0
            while any([r.step() for r in order[turn % len(order):] + order[:turn % len(order)]]):
                turn += 1
                after_turn()
            for name, run in runs.items():
                rates[name][task].append(run.tally[task].tokens_per_s)
    return rates


def bench_speculation(model: str = "tiny-moe", draft: str = "tiny-draft", gamma: int = 4, requests: int = 32,
                      batch: int = 4, rounds: int = 3, probe_every: int = 4, max_tokens: int = 48,
                      device: str = "cpu", threads: int | None = 1, seed: int = 0,
                      gammas: tuple[int, ...] = ()) -> dict[str, Any]:
    """Run the comparison; returns the flat result (see the module docstring). gammas: other draft
    lengths to measure beside `gamma` (their engines join the same lockstep)."""
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
        plain = _engine(model, None, gamma, 0, device, batch)
        probed = _engine(model, draft, gamma, probe_every, device, batch, probe)
        engines = {"plain": plain, "spec": _engine(model, draft, gamma, 0, device, batch), "probed": probed,
                   **{f"spec@{g}": _engine(model, draft, g, 0, device, batch) for g in gammas if g != gamma}}
        records = _Records(consumer)
        # Warm-up, not measured: first-use costs (allocations, kernel compiles) of every shape.
        warm = [r for t in tasks for r in [w for w in workload if w.task == t][:batch]]
        _measure(engines, warm, tasks, batch, 1, records.read)
        records.parts.clear()  # the task labels it announced are kept
        rates = _measure(engines, workload, tasks, batch, rounds, records.read)
        frames = records.frames()
        dropped = consumer.stats()["dropped"]
        probes = probed.spec_probe
        by_task = spec_speedup.speedup_by_task(frames.spec, frames.step_timing)
        advice = {str(a["task"]): a for a in spec_advice.recommendations(by_task)}
    finally:
        consumer.close()
        probe.close()
        torch.set_num_threads(old_threads)
    result: dict[str, Any] = {
        "model": model, "draft": draft, "gamma": gamma, "device": device, "threads": threads or old_threads,
        "requests": requests, "batch": batch, "rounds": rounds, "max_tokens": max_tokens, "probe_every": probe_every, "probe_steps": probes.num_probes,
        "probe_share": round(probes.num_probes / max(1, sum(probes.decode_steps_at.values())), 4),
        "dropped": dropped}
    verdicts = []
    within = 0
    for row in by_task.itertuples(index=False):
        task = str(row.task)
        if task not in rates["plain"]:
            continue
        ratios = [s / p for s, p in zip(rates["spec"][task], rates["plain"][task])]
        measured = statistics.median(ratios)
        predicted = float(row.predicted_speedup)
        error = predicted / measured - 1.0
        verdicts.append(verdict := _verdict((float(row.speedup_low), float(row.speedup_high)), ratios))
        within += bool(abs(error) <= TOLERANCE)
        result |= {
            f"{task}.measured_speedup": _num(measured),
            f"{task}.measured_rounds": [round(x, 4) for x in ratios],
            f"{task}.noise": round(max(abs(x / measured - 1.0) for x in ratios), 4),
            f"{task}.plain_tokens_per_s": round(statistics.median(rates["plain"][task]), 2),
            f"{task}.spec_tokens_per_s": round(statistics.median(rates["spec"][task]), 2),
            f"{task}.predicted_speedup": _num(predicted),
            f"{task}.predicted_interval": [_num(float(row.speedup_low)), _num(float(row.speedup_high))],
            f"{task}.error": _num(error),
            f"{task}.model_speedup": _num(float(row.model_speedup)),
            f"{task}.tau": _num(float(row.mean_accepted_length)),
            f"{task}.samples": f"{row.verifications} verifications, {row.spec_steps} speculative and "
                               f"{row.probe_steps} plain probe steps",
            f"{task}.advice": advice.get(task, {}).get("action", "none"),
            **_other_gammas(task, gamma, measured, rates),
            f"{task}.verdict": verdict,
        }
    result |= {"tasks_agree": verdicts.count("agrees"), "tasks_contradict": verdicts.count("contradicts"),
               "tasks_within_15pct": within, "tasks": len(rates["plain"]),
               "wall_s": round(time.perf_counter() - started, 1)}
    return result


def _side(low: float, high: float) -> int:
    """+1 all at or above 1, -1 all below 1, 0 holding 1."""
    return 1 if low >= 1.0 else -1 if high < 1.0 else 0


def _verdict(predicted: tuple[float, float], rounds: list[float]) -> str:
    p, m = _side(*predicted), _side(min(rounds), max(rounds))
    return "inconclusive" if p * m == 0 else "agrees" if p == m else "contradicts"


def _num(x: float) -> float | None:
    """Rounded for printing; None (JSON null) when not finite (nothing predicted)."""
    return round(x, 4) if math.isfinite(x) else None


def _other_gammas(task: str, gamma: int, measured: float, rates: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Measured speedup at each other gamma, and the best gamma by measurement (the running one
    unless another is faster in every round)."""
    out: dict[str, Any] = {}
    best, best_s = gamma, measured
    for name in sorted(n for n in rates if n.startswith("spec@")):
        g = int(name.split("@")[1])
        ratios = [s / p for s, p in zip(rates[name][task], rates["plain"][task])]
        out[f"{task}.measured_speedup_gamma_{g}"] = _num(statistics.median(ratios))
        spec_rounds = [s / p for s, p in zip(rates["spec"][task], rates["plain"][task])]
        if all(x > y for x, y in zip(ratios, spec_rounds)) and statistics.median(ratios) > best_s:
            best, best_s = g, statistics.median(ratios)
    if out:
        out[f"{task}.best_gamma"] = best
    return out
