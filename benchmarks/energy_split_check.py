"""Energy split per request against a known answer on a GPU: request classes alone, then mixed,
on DYNAMIC energy (the counter's rise less the GPU's idle power x time).

Run on the GPU machine (CI has no GPU; the CPU check is tests/agent/test_energy_known_answer.py):

    python3 benchmarks/energy_split_check.py [--out FILE.json] [--model llama-1b-shape] [--dtype bfloat16]
        [--phase-s 30] [--idle-s 5] [--interval-s 1.0] [--concurrency 16] [--long-prompt 1024] [--long-output 256]

The engine (warmed up unobserved first, as the demo does) serves two classes of requests with the
agent beside it in this process (polling on its own thread, its sampler reading NVML every
--interval-s): `long_prompt` (--long-prompt tokens in, 4 out) and `long_output` (32 in,
--long-output out). Four phases, --idle-s of idle before each and after the last:

  1. long_prompt alone, 2. long_output alone: --concurrency requests of the class kept in flight
     for --phase-s, then drained. A class's joules per request alone need no split: every step of
     the phase is the class's.
  3. mixed: both classes in flight at once (--concurrency each), for --phase-s, then drained.
  4. long_prompt again: its alone figure a second time (alone_repeat_ratio: how stable "alone" is).

Why dynamic: a GPU draws its static power (an H200 ~100 W) for as long as a phase lasts, and how
long that is depends on throughput (long prompts ran 6/s mixed against 4.1/s alone on the H200), so
a class's TOTAL joules per request alone are not a property of the request, and no split can match
them. The known answer is each class's dynamic joules per request alone:

    (counter's rise over the phase - idle_w x the phase's seconds) / requests

with idle_w MEASURED here, independently of the agent: this script's own NVML reads at the ends of
the idle gaps (no request in flight), their rise over their seconds. The agent's side is its
energy_dynamic_j (correlate.token_cost: the step's energy cut by the fitted static power and
dynamic joules per token) summed per class over the mixed phase's requests / requests; goal: within
CLASS_TOLERANCE of the alone figure. The same is printed with the agent's fitted static watts in
place of idle_w (static while steps run can differ from idle: clocks stay up between steps).
additivity_dynamic: the mixed phase's dynamic energy (counter - idle_w x seconds) over what the alone
figures predict for its requests; goal_reachable: whether any split that conserves it could meet
the goal (the classes' errors, weighted, average to additivity - 1). For comparison the mixed phase's
dynamic energy is split offline from the agent's own event files with the whole run's final fit
(the same cut of each step into dynamic and static) by the agent's rule (model_final_fit) and by
token share. The TOTAL figures (energy_j, what users see: dynamic + the static share) are kept,
labelled total_*: their errors against the alone totals are expected to miss.

Before the phases, --warmup-s of both classes unobserved, so the first phase does not pay for the
workload's first shapes.

Prints `key: value` lines, then a short table last; writes everything to --out (default
$OUT/energy_split_check.json) and the agent's files to energy_split_run/ beside it. Exit status: 0
goal met, 1 missed, 2 no CUDA / NVML. --cpu-dry-run runs the same phases on the CPU against a fake
counter (tests/gpu's fake NVML: 100 W on the wall clock + 200 W x this process's CPU time): it
checks the script, its numbers mean nothing.
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


def _offline_splits(run_dir: Path, phase_ids: set[int],
                    idle_w: float | None) -> tuple[dict[str, dict[int, float]], dict[str, Any]]:
    """The mixed phase's requests' DYNAMIC joules split offline from the agent's event files: each
    step's energy cut into dynamic and static by the energy model fitted on every counter interval of
    the run (correlate.token_cost.step_dynamic_share), the dynamic part split two ways: by the model's
    weights, and by token share. Same counter, same interpolation (correlate.energy) as the agent.
    The final fit holds the static power at idle_w (the agent's measured idle power, as the agent
    does) where given; model_free_static is the same with the static power fitted.
    Returns (how -> request -> dynamic J, the final fit described)."""
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
    ran = steps[steps["batch_size"] > 0]
    measured = ran.merge(windows[["step_id", "value"]], on="step_id").rename(columns={"value": "energy_uj"})
    first = np.sort(counter.loc[counter["gpu"] == counter["gpu"].min(), "ts_ns"].to_numpy("int64"))
    merged, _, _ = token_cost.merge_short_intervals(token_cost.interval_rows(measured, first), int(first[0]))
    equations = token_cost.normal_equations(merged)
    fit = token_cost.fit_token_costs(*equations, idle_w)
    free = token_cost.fit_token_costs(*equations)
    chunks = req[req["event"].astype(str) == "PREFILL_CHUNK"][["request_id", "ts_ns"]]
    members = token_cost.member_tokens(steps, batch, chunks)
    cut = steps[["step_id", *token_cost.STEP_KIND_COLUMNS.values()]].merge(
        windows[["step_id", "start_ns", "end_ns", "value"]], on="step_id")

    def dynamic(f: token_cost.TokenCosts) -> pd.Series:
        value = cut["value"].to_numpy(np.float64)
        return pd.Series(np.rint(value * token_cost.step_dynamic_share(cut, f, value)),
                         index=cut["step_id"].to_numpy(np.int64))

    out: dict[str, dict[int, float]] = {}
    for how, weight, f in (("token_share", None, fit), ("model_final_fit", token_cost.member_weights(members, fit), fit),
                           ("model_free_static", token_cost.member_weights(members, free), free)):
        uj = cost.split_in_proportion(batch, weight, dynamic(f))
        joules = pd.Series(uj / 1e6).groupby(batch["request_id"].to_numpy()).sum()
        out[how] = {int(r): float(j) for r, j in joules.items() if int(r) in phase_ids}
    return out, fit.describe() | {"free_static_fit": free.describe()}


def run(args: argparse.Namespace, counter_mj: Callable[[], int], gpu_collector: Any = None) -> dict[str, Any]:
    from infersight.agent.config import AgentConfig
    from infersight.agent.gpu_config import GpuConfig
    from infersight.agent.energy_summary import describe_energy
    from infersight.agent.service import Agent
    from infersight.bench.engine.switch import SwitchObserver
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
    agent = Agent(AgentConfig(rings=[ring], port=0, parquet_dir=str(run_dir),
                              gpu=GpuConfig(source="nvml", interval_s=args.interval_s, energy_gpus=(0,))), gpu_collector=gpu_collector)
    ids: dict[int, str] = {}
    phases: list[dict[str, Any]] = []
    gaps: list[dict[str, Any]] = []  # the idle gaps: no request in flight
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            agent.poll_once()
            done.wait(0.1)

    def idle(before: str) -> None:
        """--idle-s with nothing in flight, read on this script's own counter: the idle power. Read
        at the middle too: a GPU's power can still be settling after a phase (late_w against watts)."""
        e0, t0 = counter_mj(), time.monotonic_ns()
        time.sleep(args.idle_s / 2)
        em, tm = counter_mj(), time.monotonic_ns()
        time.sleep(args.idle_s / 2)
        e1, t1 = counter_mj(), time.monotonic_ns()
        gaps.append({"before": before, "counter_j": (e1 - e0) / 1e3, "seconds": (t1 - t0) / 1e9,
                     "late_w": (e1 - em) / ((t1 - tm) / 1e6)})

    poller = threading.Thread(target=poll, daemon=True)
    try:
        agent.start_http()  # starts the sampler's thread too
        poller.start()
        for name, classes in (("long_prompt", ("long_prompt",)), ("long_output", ("long_output",)),
                              ("mixed", CLASSES), ("long_prompt_again", ("long_prompt",))):
            idle(name)  # idle apart: the phases' edges fall in different readings
            before, e0, t0 = set(ids), counter_mj(), time.monotonic_ns()
            _closed_loop(engine, args, classes, ids)
            e1, t1 = counter_mj(), time.monotonic_ns()
            phases.append({"phase": name, "request_ids": sorted(set(ids) - before), "counter_j": (e1 - e0) / 1e3,
                           "seconds": (t1 - t0) / 1e9})
        idle("end")
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
    offline, final_fit = _offline_splits(run_dir, mixed_ids, agent.state.energy.idle_w)
    return summarise(args, phases, gaps, rows, ids, offline, describe_energy(agent.state.energy)) | {"final_fit": final_fit}


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def summarise(args: argparse.Namespace, phases: list[dict[str, Any]], gaps: list[dict[str, Any]],
              rows: dict[int, dict[str, Any]], ids: dict[int, str], offline: dict[str, dict[int, float]],
              energy: dict[str, Any]) -> dict[str, Any]:
    """The figures (see the module docstring); the phases: long_prompt, long_output, mixed, long_prompt_again."""
    def per_class(joules: dict[int, float], members: list[int]) -> dict[str, float]:
        """Mean joules per request of each class among members (NaN values left out)."""
        out = {}
        for c in CLASSES:
            vals = [joules[r] for r in members if ids[r] == c and r in joules and joules[r] == joules[r]]
            out[c] = sum(vals) / len(vals) if vals else float("nan")
        return out

    by_name = {p["phase"]: p for p in phases}
    idle_w = _ratio(sum(g["counter_j"] for g in gaps), sum(g["seconds"] for g in gaps))  # measured
    # The agent's static power: its fit's, or the idle power it measured itself and held the fit at.
    static_w = (energy.get("split_model") or {}).get("static_w", float("nan"))

    def dynamic_per_request(p: dict[str, Any], watts: float) -> float:
        return _ratio(p["counter_j"] - watts * p["seconds"], len(p["request_ids"]))

    alone = {c: by_name[c] for c in CLASSES}
    alone_dyn = {c: dynamic_per_request(alone[c], idle_w) for c in CLASSES}
    alone_dyn_fitted = {c: dynamic_per_request(alone[c], static_w) for c in CLASSES}
    mixed = by_name["mixed"]["request_ids"]
    n_mixed = {c: sum(ids[r] == c for r in mixed) for c in CLASSES}
    dyn_j = {r: float(row["energy_dynamic_j"]) for r, row in rows.items()}
    total_j = {r: float(row["energy_j"]) for r, row in rows.items()}
    bound_j = {r: float(row["energy_sampling_bound_j"]) for r, row in rows.items()}
    splits = {"agent": per_class(dyn_j, mixed), **{k: per_class(v, mixed) for k, v in offline.items()}}
    errors = {how: {c: _ratio(split[c], alone_dyn[c]) - 1 for c in CLASSES} for how, split in splits.items()}
    errors_fitted = {c: _ratio(splits["agent"][c], alone_dyn_fitted[c]) - 1 for c in CLASSES}
    mixed_dyn = by_name["mixed"]["counter_j"] - idle_w * by_name["mixed"]["seconds"]
    additivity = _ratio(mixed_dyn, sum(n_mixed[c] * alone_dyn[c] for c in CLASSES))

    def share_errors(split: dict[str, float]) -> dict[str, float]:
        """Each class's share of the mixed phase's split dynamic energy against its share predicted by
        the alone figures, less 1: the split between the classes, apart from how much energy the
        mixed phase drew in all (additivity, a property of the batching, not of any split)."""
        got = sum(n_mixed[c] * split[c] for c in CLASSES)
        want = sum(n_mixed[c] * alone_dyn[c] for c in CLASSES)
        return {c: _ratio(split[c] / got, alone_dyn[c] / want) - 1 for c in CLASSES}

    shares = {how: share_errors(split) for how, split in splits.items()}
    # Total joules (what users see in energy_j): the agent's in steps and the counter's, per request.
    alone_total_steps = {c: per_class(total_j, alone[c]["request_ids"])[c] for c in CLASSES}
    total_mixed = per_class(total_j, mixed)
    again = by_name.get("long_prompt_again")
    return {
        "model": args.model, "dtype": args.dtype, "interval_s": args.interval_s, "phase_s": args.phase_s,
        "concurrency": args.concurrency, "shapes": _shapes(args),
        "phases": [{k: v for k, v in p.items() if k != "request_ids"} | {"requests": len(p["request_ids"])}
                   for p in phases],
        "idle_gaps": [g | {"watts": _ratio(g["counter_j"], g["seconds"])} for g in gaps],
        "idle_w_measured": idle_w, "static_w_fitted": static_w,
        "agent_static_from": (energy.get("split_model") or {}).get("static_from"),
        "agent_idle_w_measured": energy.get("idle_w_measured"),
        "alone_dynamic_j_per_request": alone_dyn, "alone_dynamic_j_per_request_fitted_static": alone_dyn_fitted,
        "mixed_requests": n_mixed,
        "mixed_requests_without_dynamic": sum(1 for r in mixed if dyn_j.get(r, float("nan")) != dyn_j.get(r)),
        "mixed_dynamic_j_per_request": splits, "mixed_dynamic_error_vs_alone": errors,
        "mixed_dynamic_error_vs_alone_fitted_static": errors_fitted,
        "mixed_dynamic_share_error_vs_alone": shares,
        "goal_met_shares": all(abs(e) <= CLASS_TOLERANCE for e in shares["agent"].values()),
        "additivity_dynamic": additivity,
        # The alone figure taken again after the mixed phase, over the first: how stable "alone" is.
        "alone_repeat_ratio_dynamic": _ratio(dynamic_per_request(again, idle_w), alone_dyn["long_prompt"])
        if again else float("nan"),
        # Conserving the counter, the class errors average (weighted by predicted energy) to additivity - 1:
        # some class misses by at least that much, whatever the split.
        "goal_reachable": abs(additivity - 1) <= CLASS_TOLERANCE,
        "mixed_sampling_bound_j_per_request": per_class(bound_j, mixed),
        "tolerance": CLASS_TOLERANCE,
        "goal_met": all(abs(e) <= CLASS_TOLERANCE for e in errors["agent"].values()),
        "goal_met_fitted_static": all(abs(e) <= CLASS_TOLERANCE for e in errors_fitted.values()),
        "total_alone_j_per_request_in_steps": alone_total_steps,
        "total_alone_j_per_request_counter": {c: _ratio(alone[c]["counter_j"], len(alone[c]["request_ids"]))
                                              for c in CLASSES},
        "total_mixed_j_per_request": total_mixed,
        "total_mixed_error_vs_alone": {c: _ratio(total_mixed[c], alone_total_steps[c]) - 1 for c in CLASSES},
        "total_additivity": _ratio(sum(total_j[r] for r in mixed if r in total_j),
                                   sum(n_mixed[c] * alone_total_steps[c] for c in CLASSES)),
        "agent_energy": energy,
    }


def print_result(result: dict[str, Any]) -> None:
    for key in ("model", "dtype", "interval_s", "phase_s", "concurrency", "idle_w_measured", "static_w_fitted",
                "agent_static_from", "agent_idle_w_measured",
                "additivity_dynamic", "alone_repeat_ratio_dynamic", "goal_reachable", "goal_met",
                "goal_met_fitted_static", "goal_met_shares", "mixed_requests_without_dynamic", "total_additivity"):
        print(f"{key}: {result[key]}")
    for p in result["phases"]:
        print(f"phase {p['phase']}: {p['requests']} requests, {p['seconds']:.1f} s, counter {p['counter_j']:.1f} J "
              f"({p['counter_j'] / p['seconds']:.0f} W)")
    print("idle gaps, measured W (second half): "
          + ", ".join(f"{g['watts']:.1f} ({g['late_w']:.1f})" for g in result["idle_gaps"]))
    print(f"split model (agent, final): {json.dumps(result['agent_energy'].get('split_model', {}))}")
    ways = (("agent", "agent"), ("final fit", "model_final_fit"), ("free st", "model_free_static"),
            ("tokens", "token_share"))
    print("DYNAMIC J/request (alone: counter - idle W x s, measured; mixed: modelled split of measured energy)")
    print(f"{'class':<12} {'alone':>8} {'(fit st)':>8} {'bound J':>8} "
          + " ".join(f"{name:>10} {'err':>7}" for name, _ in ways) + f" {'err(fit st)':>11}")
    for c in CLASSES:
        s, e = result["mixed_dynamic_j_per_request"], result["mixed_dynamic_error_vs_alone"]
        print(f"{c:<12} {result['alone_dynamic_j_per_request'][c]:>8.3f} "
              f"{result['alone_dynamic_j_per_request_fitted_static'][c]:>8.3f} "
              f"{result['mixed_sampling_bound_j_per_request'][c]:>8.3f} "
              + " ".join(f"{s[k][c]:>10.3f} {e[k][c]:>+7.1%}" for _, k in ways)
              + f" {result['mixed_dynamic_error_vs_alone_fitted_static'][c]:>+11.1%}")
    print("share of the mixed phase's split dynamic energy against the alone figures' share (additivity apart): "
          + "; ".join(f"{name} " + ", ".join(f"{c} {result['mixed_dynamic_share_error_vs_alone'][k][c]:+.1%}"
                                             for c in CLASSES) for name, k in ways))
    print("TOTAL J/request (what energy_j shows: dynamic + static share; not invariant, for reference)")
    for c in CLASSES:
        print(f"{c:<12} alone {result['total_alone_j_per_request_in_steps'][c]:.3f} (counter "
              f"{result['total_alone_j_per_request_counter'][c]:.3f}), "
              f"mixed {result['total_mixed_j_per_request'][c]:.3f} ({result['total_mixed_error_vs_alone'][c]:+.1%})")
    print(f"goal: each class's mixed dynamic J/request within {result['tolerance']:.0%} of alone: "
          f"{'PASS' if result['goal_met'] else 'FAIL'} (with the fitted static in place of idle W: "
          f"{'PASS' if result['goal_met_fitted_static'] else 'FAIL'}); each class's share within "
          f"{result['tolerance']:.0%}: {'PASS' if result['goal_met_shares'] else 'FAIL'}")


def _cpu_dry_run() -> tuple[Callable[[], int], Any]:
    """A counter of 100 W on the wall clock plus 200 W x this process's CPU time, behind the tests'
    fake pynvml: something that rises faster while the engine computes, so every figure is finite."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
    from gpu_fakes import FakeGpuState, FakeNvml

    from infersight.gpu.nvml_collector import NvmlCollector

    t0, cpu0 = time.monotonic_ns(), time.process_time_ns()

    class ClockPowered(FakeGpuState):
        @property  # type: ignore[override]
        def energy_mj(self) -> int:
            wall_ms, cpu_ms = (time.monotonic_ns() - t0) // 1_000_000, (time.process_time_ns() - cpu0) // 1_000_000
            return 1_000_000 + 100 * wall_ms + 200 * cpu_ms  # W x ms = mJ

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
    ap.add_argument("--idle-s", type=float, default=5.0,
                    help="idle before each phase and after the last: where the idle power is measured")
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
