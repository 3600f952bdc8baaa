"""`infersight bench speculation`: the speedup speculation really gives, per task, against the
speedup the agent predicts from its probe records.

Three engines of one process run the same task-labelled requests (infersight.workload), one
task at a time at a fixed batch size (bench.fixed_batch), stepped in turn so that drift in the
machine's speed hits them alike:

    plain      no draft model                                  measured
    spec       the draft, gamma drafts per step                measured
    probed     the draft and spec_probe_every: plain probe     predicted, through the agent's own
               steps, its records read from a probe ring       correlate functions (spec_speedup,
                                                               spec_advice)

Measured speedup per task: decode tokens/s of `spec` over `plain` (decode tokens and the engine
time of the steps each request decoded in), one ratio per round; reported: the median over the
rounds, their range, and the noise (largest deviation of a round from the median). The
prediction pools the probed engine's records of every round, as the agent would.

verdict per task: "agrees" when the predicted interval and every round lie on the same side of 1,
"contradicts" when they lie on opposite sides, else "inconclusive" (one of them holds 1).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from infersight.bench.fixed_batch import FixedBatchRun
from infersight.correlate import spec_advice, spec_speedup, speculation
from infersight.correlate.frames import EventFrames, update_labels
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import Engine, EngineConfig
from infersight.workload import TASKS, WorkloadConfig, build_workload

#: The goal: predicted within this share of measured, per task.
TOLERANCE = 0.15


def _engine(model: str, draft: str | None, gamma: int, probe_every: int, device: str, batch: int,
            observer: ProbeObserver | None = None) -> Engine:
    # An ample pool: no preemption, so decode time is decode and nothing else.
    config = EngineConfig(model=model, speculative_model=draft, num_speculative_tokens=gamma, device=device,
                          max_num_seqs=batch, max_num_batched_tokens=512, spec_probe_every=probe_every,
                          num_kv_blocks=(batch + 1) * 32)
    return Engine(config, observer)


def bench_speculation(model: str = "tiny-moe", draft: str = "tiny-draft", gamma: int = 4, requests: int = 32,
                      batch: int = 4, rounds: int = 3, probe_every: int = 4, max_tokens: int = 48,
                      device: str = "cpu", threads: int | None = 1, seed: int = 0) -> dict[str, Any]:
    """Run the comparison; returns the flat result (see the module docstring)."""
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)  # a shared machine: oversubscribed threads make noise, not speed
    started = time.perf_counter()
    probe = ProbeObserver(ProbeConfig(ring_name=f"infersight-bench-spec-{time.monotonic_ns()}", task_labels=TASKS,
                                      nvtx=False))
    consumer = RingConsumer.attach(probe.ring_name, record_registry())
    try:
        engines = {"plain": _engine(model, None, gamma, 0, device, batch),
                   "spec": _engine(model, draft, gamma, 0, device, batch),
                   "probed": _engine(model, draft, gamma, probe_every, device, batch, probe)}
        workload = build_workload(WorkloadConfig(num_requests=requests, max_tokens=max_tokens, seed=seed))
        frames, labels = EventFrames(), {0: "other"}
        rates: dict[str, dict[str, list[float]]] = {k: {} for k in ("plain", "spec")}
        for _ in range(rounds):
            for task in TASKS:
                listed = [r for r in workload if r.task == task]
                if not listed:
                    continue
                runs = {name: FixedBatchRun(e, listed, batch) for name, e in engines.items()}
                order = list(runs.values())
                turn = 0
                while any([r.step() for r in order[turn % 3:] + order[:turn % 3]]):
                    turn += 1
                    records = consumer.read()
                    if records:
                        labels = update_labels(labels, records)
                        frames = frames.concat(EventFrames.from_records(records, labels))
                for name in ("plain", "spec"):
                    rates[name].setdefault(task, []).append(runs[name].tally[task].tokens_per_s)
        records = consumer.read()
        if records:
            frames = frames.concat(EventFrames.from_records(records, update_labels(labels, records)))
        dropped = consumer.stats()["dropped"]
        probes = engines["probed"].spec_probe
    finally:
        consumer.close()
        probe.close()
        torch.set_num_threads(old_threads)
    by_task = spec_speedup.speedup_by_task(frames.spec, frames.step_timing)
    advice = {str(a["task"]): a for a in spec_advice.recommendations(
        by_task, speculation.acceptance_by_position(frames.spec))}
    result: dict[str, Any] = {
        "model": model, "draft": draft, "gamma": gamma, "device": device, "threads": threads or old_threads, "requests": requests, "batch": batch, "rounds": rounds, "max_tokens": max_tokens,
        "probe_every": probe_every, "probe_steps": probes.num_probes,
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
        within += abs(error) <= TOLERANCE
        result |= {
            f"{task}.measured_speedup": round(measured, 4),
            f"{task}.measured_rounds": [round(x, 4) for x in ratios],
            f"{task}.noise": round(max(abs(x / measured - 1.0) for x in ratios), 4),
            f"{task}.plain_tokens_per_s": round(statistics.median(rates["plain"][task]), 2),
            f"{task}.spec_tokens_per_s": round(statistics.median(rates["spec"][task]), 2),
            f"{task}.predicted_speedup": round(predicted, 4),
            f"{task}.predicted_interval": [round(float(row.speedup_low), 4), round(float(row.speedup_high), 4)],
            f"{task}.error": round(error, 4),
            f"{task}.model_speedup": round(float(row.model_speedup), 4),
            f"{task}.tau": round(float(row.mean_accepted_length), 4),
            f"{task}.samples": f"{row.verifications} verifications, {row.spec_steps} speculative and "
                               f"{row.probe_steps} plain probe steps",
            f"{task}.advice": advice.get(task, {}).get("action", "none"),
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
