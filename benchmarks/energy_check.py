"""Energy per request against the GPU's own counter, and the GPU panels' data, on a GPU host.

Run on the GPU machine (CI has no GPU), one command:

    python3 benchmarks/energy_check.py [--model tiny-moe] [--requests 96] [--rate 8] [--interval-s 1.0]

The engine (the demo's configuration: tiny-moe with the tiny-draft speculator on CUDA, unless
--model says otherwise) serves the demo's seeded workload with the agent beside it in this
process (polling on its own thread), its GPU sampler reading NVML every --interval-s.
Independently, this script opens NVML itself and reads each GPU's total-energy counter
(nvmlDeviceGetTotalEnergyConsumption, mJ) just before the agent's first reading and just after
its last one. Then it compares

    sum of every request's energy_j  +  the agent's idle joules    with    the independent delta

and prints the ratio (goal: within 1%). Inside the agent's window the two sides agree by
construction (idle is what the steps leave of the counter's rise): the ratio checks the agent's
readings and window against this script's own reads, not how the joules are split between
requests; benchmarks/energy_split_check.py checks the split. It also prints joules per request and per output token
by task, and which queries of the generated dashboards have their series in the agent's
exposition on this host, the GPU-fed panels first (goal: all of them). With $OUT set the
numbers go to $OUT/energy_check.json. --counter-resolution only measures how often the NVML
counter moves under a GEMM load (what bounds the interpolation between readings).
Exit status: 0 both goals met, 1 one missed, 2 no CUDA / no NVML.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

RATIO_TOLERANCE = 0.01


def _independent_mj(nvml: Any, handles: list[Any]) -> int:
    """The energy counters of the given GPUs, read here (not through infersight), summed, in mJ."""
    return sum(int(nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in handles)


def counter_resolution(seconds: float = 2.0) -> dict[str, float]:
    """Read GPU 0's energy counter back to back under a bf16 GEMM load: how often its value changes."""
    import statistics

    import pynvml
    import torch

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    reads: list[tuple[int, int]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.matmul(a, a)
        reads.append((time.monotonic_ns(), int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))))
    torch.cuda.synchronize()
    pynvml.nvmlShutdown()
    changes = [t for (t, v), (_, w) in zip(reads[1:], reads) if v != w]
    gaps = [(b - a_) / 1e6 for a_, b in zip(changes, changes[1:])]
    return {"reads": len(reads), "changes": len(changes),
            "median_ms_between_changes": statistics.median(gaps) if gaps else float("nan"),
            "watts": (reads[-1][1] - reads[0][1]) / ((reads[-1][0] - reads[0][0]) / 1e9) / 1000}


def _drive(engine: Any, workload: list) -> None:
    """Add each request at its arrival time, and step while anything runs."""
    from infersight.runtime import SamplingParams

    pending, start = list(workload), time.monotonic()
    while pending or engine.has_unfinished():
        now = time.monotonic() - start
        while pending and pending[0].arrival_s <= now:
            r = pending.pop(0)
            engine.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True,
                                                        task=r.task))
        if engine.has_unfinished():
            engine.step()
        elif pending:
            time.sleep(min(0.02, max(0.0, pending[0].arrival_s - now)))


def _poll_until(agent: Any, done: threading.Event, interval_s: float = 0.1) -> None:
    while not done.is_set():
        agent.poll_once()
        done.wait(interval_s)


def _by_task(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for task in sorted({str(r["task"]) for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        joules = sum(r["energy_j"] for r in mine)
        out[task] = {"requests": len(mine), "joules": joules, "joules_per_request": joules / len(mine),
                     "joules_per_output_token": joules / max(1, sum(r["output_tokens"] for r in mine)),
                     "engine_seconds": sum(r["engine_seconds"] for r in mine),
                     "gpu_sm_active_s": sum(r["gpu_sm_active_s"] for r in mine)}
    return out


def _coverage(exposition: str) -> dict[str, Any]:
    """The generated dashboards' queries against this host's exposition (GPU-fed panels marked)."""
    from infersight.dashboards.grafana import build_dashboards, gpu, to_json
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "dashboards"))  # test-only code
    from query_coverage import query_coverage, sample_names

    boards = {uid: json.loads(to_json(b)) for uid, b in build_dashboards().items()}
    fed = gpu.gpu_fed_titles()
    result = query_coverage(boards, sample_names(exposition))
    rows = [{"dashboard": c.dashboard, "panel": c.panel, "gpu_fed": c.dashboard == gpu.UID and c.panel in fed,
             "has_data": c.has_data, "missing": list(c.missing), "expr": c.expr} for c in result]
    gpu_rows = [r for r in rows if r["gpu_fed"]]
    return {"gpu_fed_queries": len(gpu_rows), "gpu_fed_with_data": sum(r["has_data"] for r in gpu_rows),
            "other_queries": len(rows) - len(gpu_rows),
            "other_with_data": sum(r["has_data"] for r in rows if not r["gpu_fed"]), "queries": rows}


def _print_coverage(dash: dict[str, Any]) -> None:
    """The GPU-fed queries, and any other query without data, one line each."""
    for q in dash["queries"]:
        if q["gpu_fed"] or not q["has_data"]:
            missing = f" (missing {', '.join(q['missing'])})" if q["missing"] else ""
            print(f"{'GPU ' if q['gpu_fed'] else '    '}{'ok  ' if q['has_data'] else 'NONE'} "
                  f"{q['dashboard']} / {q['panel']}: {q['expr'][:90]}{missing}")
    print(f"GPU-fed queries with data: {dash['gpu_fed_with_data']}/{dash['gpu_fed_queries']}; "
          f"other queries with data: {dash['other_with_data']}/{dash['other_queries']}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import pynvml
    from prometheus_client.exposition import generate_latest

    from infersight.agent.api import report
    from infersight.agent.config import AgentConfig
    from infersight.agent.gpu_config import GpuConfig
    from infersight.agent.service import Agent
    from infersight.probes.config import ProbeConfig
    from infersight.probes.observer import ProbeObserver
    from infersight.runtime import Engine, EngineConfig
    from infersight.workload import TASKS, WorkloadConfig, build_workload

    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    ring = f"infersight-energy-{os.getpid()}"
    probe = ProbeObserver(ProbeConfig(ring_name=ring, task_labels=TASKS, nvtx=False))
    draft = "tiny-draft" if args.model == "tiny-moe" else None
    engine = Engine(EngineConfig(model=args.model, speculative_model=draft, device="cuda", dtype=args.dtype,
                                 num_kv_blocks=160 if args.model == "tiny-moe" else None, cpu_offload_blocks=64,
                                 max_num_seqs=32, max_num_batched_tokens=512,
                                 spec_probe_every=16 if draft else 0), probe)  # as the demo
    workload = build_workload(WorkloadConfig(num_requests=args.requests, rate_per_s=args.rate,
                                             max_tokens=args.max_tokens, seed=0))
    parquet_dir = Path(tempfile.mkdtemp(prefix="energy-check-"))
    agent = Agent(AgentConfig(rings=[ring], port=0, parquet_dir=str(parquet_dir),
                              gpu=GpuConfig(source="nvml", interval_s=args.interval_s)))
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    try:
        e_start, t_start = _independent_mj(pynvml, handles), time.monotonic_ns()
        agent.gpu.poll_once()  # the agent's first reading, right after ours
        agent.start_http()
        # The agent polls on its own thread, as its own process would beside the engine (the demo's).
        done = threading.Event()
        poller = threading.Thread(target=_poll_until, args=(agent, done), daemon=True)
        poller.start()
        _drive(engine, workload)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(agent.state.finished) < len(workload):
            time.sleep(0.05)
        done.set()
        poller.join()
        exposition = generate_latest(agent.registry).decode()
        agent.gpu.stop(final_poll=True)  # the agent's last reading, right before ours
        e_end, t_end = _independent_mj(pynvml, handles), time.monotonic_ns()
        agent.close()
    finally:
        agent.close()
        probe.close()
        pynvml.nvmlShutdown()
    rows = list(agent.state.finished)
    meter = agent.state.energy
    import pyarrow.parquet as pq

    parquet = pq.read_table(parquet_dir / "requests.parquet", columns=["energy_j"]).to_pandas()
    parquet_j = float(parquet["energy_j"].sum())
    requests_j = sum(r["energy_j"] for r in rows)
    idle_j = meter.idle_uj / 1e6
    independent_j = (e_end - e_start) / 1000.0
    return {
        "model": args.model, "requests": len(rows), "interval_s": args.interval_s,
        "gpus": list(meter.gpus), "run_s": (t_end - t_start) / 1e9,
        "agent_window_s": ((meter.cursor_ns or 0) - (meter.from_ns or 0)) / 1e9,
        "window_gap_start_ms": ((meter.from_ns or 0) - t_start) / 1e6,
        "window_gap_end_ms": (t_end - (meter.cursor_ns or 0)) / 1e6,
        "requests_j": requests_j, "parquet_requests_j": parquet_j, "idle_j": idle_j,
        "independent_delta_j": independent_j,
        "ratio": (requests_j + idle_j) / independent_j if independent_j > 0 else float("nan"),
        "mean_power_w": independent_j / ((t_end - t_start) / 1e9),
        "steps_measured": meter.steps_measured, "steps_unmeasured": meter.steps_dropped,
        "rows_released_before_measured": meter.rows_timed_out,
        "requests_without_energy": sum(1 for r in rows if r["energy_j"] != r["energy_j"]),
        "by_task": _by_task(rows), "summary_energy": report.summary(agent.state)["cost"]["energy"],
        "dashboards": _coverage(exposition),
    }



def gpu_problem() -> str | None:
    """Why a GPU energy check cannot run here; None when torch sees CUDA and nvidia-ml-py imports."""
    try:
        import pynvml  # noqa: F401
        import torch
    except ImportError as e:
        return f"needs torch and nvidia-ml-py: {e}"
    if not torch.cuda.is_available():
        return "no CUDA device: this check runs on the GPU machine"
    return None

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--rate", type=float, default=8.0, help="mean Poisson arrivals per second")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--interval-s", type=float, default=1.0, help="the agent's GPU sampling interval (its default)")
    ap.add_argument("--exposition", metavar="FILE",
                    help="only check the dashboards' queries against a saved scrape (the demo's metrics.prom)")
    ap.add_argument("--counter-resolution", action="store_true", help="only measure how often the counter moves")
    args = ap.parse_args()
    if args.exposition:
        dash = _coverage(Path(args.exposition).read_text())
        _print_coverage(dash)
        return 0 if dash["gpu_fed_with_data"] == dash["gpu_fed_queries"] else 1
    problem = gpu_problem()
    if problem:
        print(problem)
        return 2
    if args.counter_resolution:
        print(json.dumps(counter_resolution()))
        return 0
    result = run(args)
    for key, value in result.items():
        if key not in ("by_task", "dashboards", "summary_energy"):
            print(f"{key}: {value:.6g}" if isinstance(value, float) else f"{key}: {value}")
    for task, t in result["by_task"].items():
        print(f"task {task}: {t['requests']} requests, {t['joules_per_request']:.3f} J/request, "
              f"{t['joules_per_output_token']:.4f} J/output token, SM-active {t['gpu_sm_active_s']:.3f} s "
              f"of {t['engine_seconds']:.3f} engine s")
    dash = result["dashboards"]
    _print_coverage(dash)
    ratio_ok = abs(result["ratio"] - 1.0) <= RATIO_TOLERANCE
    panels_ok = dash["gpu_fed_with_data"] == dash["gpu_fed_queries"]
    print(f"energy ratio (requests + idle) / NVML delta: {result['ratio']:.5f} "
          f"({'PASS' if ratio_ok else 'FAIL'}, goal within {RATIO_TOLERANCE:.0%}); "
          f"GPU panels: {'PASS' if panels_ok else 'FAIL'}")
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "energy_check.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "dashboards"}, default=str))
    return 0 if ratio_ok and panels_ok else 1


if __name__ == "__main__":
    sys.exit(main())
