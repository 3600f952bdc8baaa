"""Energy split per request against a known answer on a GPU: request classes alone, then mixed.

Run on the GPU machine (CI has no GPU; the CPU check is tests/agent/test_energy_known_answer.py):

    python3 benchmarks/energy_split_check.py [--out FILE.json] [--model llama-1b-shape] [--dtype bfloat16]
        [--phase-s 30] [--interval-s 1.0] [--concurrency 16] [--long-prompt 1024] [--long-output 256]

The engine (warmed up unobserved first, as the demo does) serves two classes of requests with the
agent beside it in this process (polling on its own thread, its sampler reading NVML every
--interval-s): `long_prompt` (--long-prompt tokens in, 4 out) and `long_output` (32 in,
--long-output out). Three phases, --idle-s of idle between them:

  1. long_prompt alone, 2. long_output alone: --concurrency requests of the class kept in flight
     for --phase-s, then drained. A class's joules per request alone need no split: every step of
     the phase is the class's. Two figures: the agent's (energy in the phase's steps / requests)
     and the counter's (this script's own NVML reads at the phase's ends / requests, idle gaps in).
  3. mixed: both classes in flight at once (--concurrency each), for --phase-s, then drained.
  4. long_prompt again: its alone figure a second time (alone_repeat_ratio: how stable "alone" is).

Before them, --warmup-s of both classes unobserved, so the first phase does not pay for the
workload's first shapes. goal_reachable: whether any split that conserves the counter could meet
the goal (the classes' errors, weighted, average to additivity - 1).

The agent's split of the mixed phase (energy_j summed per class / requests) is compared with each
class's alone figure; goal: within CLASS_TOLERANCE. For comparison the same phase is split offline
from the agent's own event files: by token share (the old rule), and by the energy model fitted on
the whole run's counter intervals (correlate.token_cost, the agent's rule with its final fit). additivity: the mixed
phase's energy in steps over what the alone figures predict for its requests; far from 1 means the
classes interact (batching), and no split can match both alone figures then.

Prints `key: value` lines, then a short table last; writes everything to --out (default
$OUT/energy_split_check.json) and the agent's files to energy_split_run/ beside it. Exit status: 0
goal met, 1 missed, 2 no CUDA / NVML. --cpu-dry-run runs the same phases on the CPU against a fake counter of constant power (tests/gpu's
fake NVML): it checks the script, its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

CLASS_TOLERANCE = 0.15
CLASSES = ("long_prompt", "long_output")


def _shapes(args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    """class -> (prompt tokens, output tokens)."""
    return {"long_prompt": (args.long_prompt, 4), "long_output": (32, args.long_output)}


def _closed_loop(engine: Any, args: argparse.Namespace, classes: tuple[str, ...], ids: dict[int, str]) -> None:
    """Keep --concurrency requests of each class in flight for --phase-s, then drain."""
    import torch

    from infersight.runtime import SamplingParams

    shapes, vocab = _shapes(args), engine.config.model_config.vocab_size
    gen = torch.Generator().manual_seed(len(ids))
    live: dict[str, set[int]] = {c: set() for c in classes}
    end = time.monotonic() + args.phase_s
    while True:
        submitting = time.monotonic() < end
        for c in classes:
            live[c] = {r for r in live[c] if not engine.requests[r].is_finished}
            while submitting and len(live[c]) < args.concurrency:
                n_in, n_out = shapes[c]
                rid = engine.add_request(torch.randint(3, vocab, (n_in,), generator=gen).tolist(),
                                         SamplingParams(temperature=0.0, max_tokens=n_out, ignore_eos=True, task=c))
                ids[rid] = c
                live[c].add(rid)
        if not engine.has_unfinished():
            break
        engine.step()


def _offline_splits(run_dir: Path, phase_ids: set[int]) -> dict[str, dict[int, float]]:
    """The mixed phase's requests' joules split offline from the agent's event files, two ways:
    token share, and the energy model fitted on every counter interval of the run. Same counter, same
    interpolation (correlate.energy) as the agent; only the split differs."""
    import numpy as np
    import pandas as pd

    from infersight.correlate import cost, token_cost
    from infersight.correlate import energy as E

    ev = run_dir / "events"
    steps, batch = pd.read_parquet(ev / "steps.parquet"), pd.read_parquet(ev / "batch.parquet")
    req = pd.read_parquet(ev / "request_events.parquet", columns=["request_id", "ts_ns", "event"])
    gpu = pd.read_parquet(ev / "gpu.parquet")
    gpu = gpu[(gpu["field"] == "energy_joules") & (gpu["instance"] == "")]
    counter = pd.DataFrame({"ts_ns": gpu["ts_ns"].astype("int64"), "gpu": gpu["gpu"].astype("int64"),
                            "value": np.rint(gpu["value"].to_numpy() * 1e6).astype("int64")})
    span = (int(counter["ts_ns"].min()), int(counter["ts_ns"].max()))
    steps = steps[(steps["start_ns"] >= span[0]) & (steps["end_ns"] <= span[1])]
    batch = batch[batch["step_id"].isin(steps["step_id"])].reset_index(drop=True)
    windows, _ = E.step_values(steps, counter, *span)
    per_step = windows.set_index("step_id")["value"].astype("float64")
    ran = steps[steps["batch_size"] > 0]
    measured = ran.merge(windows[["step_id", "value"]], on="step_id").rename(columns={"value": "energy_uj"})
    first = np.sort(counter.loc[counter["gpu"] == counter["gpu"].min(), "ts_ns"].to_numpy("int64"))
    fit = token_cost.fit_token_costs(*token_cost.normal_equations(token_cost.interval_rows(measured, first)))
    chunks = req[req["event"].astype(str) == "PREFILL_CHUNK"][["request_id", "ts_ns"]]
    members = token_cost.member_tokens(steps, batch, chunks)
    out: dict[str, dict[int, float]] = {}
    for how, weight in (("token_share", None), ("model_final_fit", token_cost.member_weights(members, fit))):
        uj = cost.split_in_proportion(batch, weight, per_step)
        joules = pd.Series(uj / 1e6).groupby(batch["request_id"].to_numpy()).sum()
        out[how] = {int(r): float(j) for r, j in joules.items() if int(r) in phase_ids}
    return out


def run(args: argparse.Namespace, counter_mj: Callable[[], int], gpu_collector: Any = None) -> dict[str, Any]:
    from infersight.agent.config import AgentConfig
    from infersight.agent.service import Agent
    from infersight.bench.switch import SwitchObserver
    from infersight.demo import warm_up
    from infersight.probes.config import ProbeConfig
    from infersight.probes.observer import ProbeObserver
    from infersight.runtime import Engine, EngineConfig, EngineObserver

    run_dir = args.out.parent / "energy_split_run"
    run_dir.mkdir(parents=True, exist_ok=True)
    ring = f"infersight-energy-split-{os.getpid()}"
    probe = ProbeObserver(ProbeConfig(ring_name=ring, task_labels=list(CLASSES), nvtx=False))
    switch = SwitchObserver({"off": EngineObserver(), "probes": probe}, initial="off")
    engine = Engine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                                 max_num_seqs=2 * args.concurrency, max_num_batched_tokens=args.max_batched_tokens),
                    switch)
    if args.device == "cuda":
        warm_up(engine)  # unobserved: JIT, cuBLAS heuristics and graph captures land on no request
    if args.warmup_s > 0:  # the workload's own shapes too, unobserved: the first phase must not pay for them
        _closed_loop(engine, argparse.Namespace(**{**vars(args), "phase_s": args.warmup_s}), CLASSES, {})
    switch.select("probes")
    agent = Agent(AgentConfig(rings=[ring], port=0, parquet_dir=str(run_dir), gpu_source="nvml",
                              gpu_interval_s=args.interval_s, energy_gpus=(0,)), gpu_collector=gpu_collector)
    ids: dict[int, str] = {}
    phases: list[dict[str, Any]] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            agent.poll_once()
            done.wait(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    try:
        agent.start_http()  # starts the sampler's thread too
        poller.start()
        time.sleep(args.idle_s)
        for name, classes in (("long_prompt", ("long_prompt",)), ("long_output", ("long_output",)),
                              ("mixed", CLASSES), ("long_prompt_again", ("long_prompt",))):
            before, e0, t0 = set(ids), counter_mj(), time.monotonic_ns()
            _closed_loop(engine, args, classes, ids)
            e1, t1 = counter_mj(), time.monotonic_ns()
            phases.append({"phase": name, "request_ids": sorted(set(ids) - before), "counter_j": (e1 - e0) / 1e3,
                           "seconds": (t1 - t0) / 1e9})
            time.sleep(args.idle_s)  # idle apart: the phases' edges fall in different readings
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(agent.state.finished) < len(ids):
            time.sleep(0.1)
        done.set()
        poller.join()
        agent.close()
    finally:
        done.set()
        agent.close()
        probe.close()
    rows = {int(r["request_id"]): r for r in agent.state.finished}
    mixed_ids = set(phases[2]["request_ids"])
    offline = _offline_splits(run_dir, mixed_ids)
    return summarise(args, phases, rows, ids, offline, agent.state.energy.describe())


def summarise(args: argparse.Namespace, phases: list[dict[str, Any]], rows: dict[int, dict[str, Any]],
              ids: dict[int, str], offline: dict[str, dict[int, float]], energy: dict[str, Any]) -> dict[str, Any]:
    def per_class(joules: dict[int, float], members: list[int]) -> dict[str, float]:
        return {c: sum(joules[r] for r in members if ids[r] == c) / max(1, sum(ids[r] == c for r in members))
                for c in CLASSES}

    agent_j = {r: float(row["energy_j"]) for r, row in rows.items()}
    bound_j = {r: float(row["energy_sampling_bound_j"]) for r, row in rows.items()}
    alone_steps = {p["phase"]: per_class(agent_j, p["request_ids"])[p["phase"]] for p in phases[:2]}
    alone_counter = {p["phase"]: p["counter_j"] / max(1, len(p["request_ids"])) for p in phases[:2]}
    mixed = phases[2]["request_ids"]
    n_mixed = {c: sum(ids[r] == c for r in mixed) for c in CLASSES}
    splits = {"agent": per_class(agent_j, mixed), **{k: per_class(v, mixed) for k, v in offline.items()}}
    errors = {how: {c: split[c] / alone_steps[c] - 1 for c in CLASSES} for how, split in splits.items()}
    in_steps_mixed = sum(agent_j[r] for r in mixed)
    predicted = sum(n_mixed[c] * alone_steps[c] for c in CLASSES)
    additivity = in_steps_mixed / predicted if predicted else float("nan")
    return {
        "model": args.model, "dtype": args.dtype, "interval_s": args.interval_s, "phase_s": args.phase_s,
        "concurrency": args.concurrency, "shapes": _shapes(args),
        "phases": [{k: v for k, v in p.items() if k != "request_ids"} | {"requests": len(p["request_ids"])}
                   for p in phases],
        "alone_j_per_request_in_steps": alone_steps, "alone_j_per_request_counter": alone_counter,
        "mixed_requests": n_mixed, "mixed_j_per_request": splits, "mixed_error_vs_alone": errors,
        "additivity": additivity,
        # The alone figure taken again after the mixed phase, over the first: how stable "alone" is.
        "alone_repeat_ratio": (per_class(agent_j, phases[3]["request_ids"])["long_prompt"] / alone_steps["long_prompt"]
                               if len(phases) > 3 else float("nan")),
        # Conserving the counter, the class errors average (weighted by predicted energy) to additivity - 1:
        # some class misses by at least that much, whatever the split.
        "goal_reachable": abs(additivity - 1) <= CLASS_TOLERANCE,
        "mixed_sampling_bound_j_per_request": per_class(bound_j, mixed),
        "tolerance": CLASS_TOLERANCE,
        "goal_met": all(abs(e) <= CLASS_TOLERANCE for e in errors["agent"].values()),
        "agent_energy": energy,
    }


def print_result(result: dict[str, Any]) -> None:
    for key in ("model", "dtype", "interval_s", "phase_s", "concurrency", "additivity", "alone_repeat_ratio",
                "goal_reachable", "goal_met"):
        print(f"{key}: {result[key]}")
    for p in result["phases"]:
        print(f"phase {p['phase']}: {p['requests']} requests, {p['seconds']:.1f} s, counter {p['counter_j']:.1f} J")
    fit = result["agent_energy"].get("split_model", {})
    print(f"split model: {json.dumps(fit)}")
    ways = (("agent", "agent"), ("final fit", "model_final_fit"), ("tokens", "token_share"))
    print(f"{'class':<12} {'alone J/req':>11} {'(counter)':>10} {'bound J':>8} "
          + " ".join(f"{name:>10} {'err':>7}" for name, _ in ways))
    for c in CLASSES:
        s, e = result["mixed_j_per_request"], result["mixed_error_vs_alone"]
        bound = result["mixed_sampling_bound_j_per_request"][c]
        print(f"{c:<12} {result['alone_j_per_request_in_steps'][c]:>11.3f} "
              f"{result['alone_j_per_request_counter'][c]:>10.3f} {bound:>8.3f} "
              + " ".join(f"{s[k][c]:>10.3f} {e[k][c]:>+7.1%}" for _, k in ways))
    print(f"goal: each class's mixed J/request within {result['tolerance']:.0%} of alone: "
          f"{'PASS' if result['goal_met'] else 'FAIL'}")


def _cpu_dry_run() -> tuple[Callable[[], int], Any]:
    """A counter of constant power on the wall clock, behind the tests' fake pynvml."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
    from gpu_fakes import FakeGpuState, FakeNvml

    from infersight.gpu.nvml_collector import NvmlCollector

    t0 = time.monotonic_ns()

    class ClockPowered(FakeGpuState):
        @property  # type: ignore[override]
        def energy_mj(self) -> int:
            return 1_000_000 + 300 * (time.monotonic_ns() - t0) // 1_000_000  # 300 W

        @energy_mj.setter
        def energy_mj(self, _: int) -> None:
            pass

    state = ClockPowered(uuid="GPU-dry-run", power_mw=300_000)
    return (lambda: state.energy_mj), NvmlCollector(FakeNvml([state]), gpm=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-1b-shape")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--phase-s", type=float, default=30.0, help="how long each phase keeps submitting")
    ap.add_argument("--idle-s", type=float, default=3.0, help="idle before and after each phase")
    ap.add_argument("--warmup-s", type=float, default=10.0, help="both classes, unobserved, before the phases")
    ap.add_argument("--interval-s", type=float, default=1.0, help="the agent's GPU sampling interval (its default)")
    ap.add_argument("--concurrency", type=int, default=16, help="requests of each class in flight")
    ap.add_argument("--long-prompt", type=int, default=1024, help="prompt tokens of the long_prompt class")
    ap.add_argument("--long-output", type=int, default=256, help="output tokens of the long_output class")
    ap.add_argument("--max-batched-tokens", type=int, default=512)
    ap.add_argument("--device", default="cuda", choices=["cuda"], help="the engine's device (a GPU)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the JSON results (default $OUT/energy_split_check.json); the agent's files go beside it")
    ap.add_argument("--cpu-dry-run", action="store_true", help="check the script on the CPU (numbers meaningless)")
    args = ap.parse_args()
    args.out = args.out or Path(os.environ.get("OUT", "out")) / "energy_split_check.json"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"command: {' '.join(sys.argv)}")
    if args.cpu_dry_run:
        args.device = "cpu"
        counter_mj, collector = _cpu_dry_run()
        result = run(args, counter_mj, collector)
    else:
        from energy_check import gpu_problem  # benchmarks/ is the script's own directory on sys.path

        problem = gpu_problem()
        if problem:
            print(problem)
            return 2
        import pynvml
        import torch

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)  # the engine's GPU; the agent reads GPU 0 alone too
        print(f"device: {torch.cuda.get_device_name(0)}")
        try:
            result = run(args, lambda: int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)))
        finally:
            pynvml.nvmlShutdown()
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print_result(result)
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
