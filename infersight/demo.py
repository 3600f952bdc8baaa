"""`infersight demo` (what `make demo` runs): the engine with probes, the agent beside it as a
separate process with the flight recorder on, and a task-labelled workload; writes summary.json,
requests.parquet and metrics.prom, and prints a short summary.

Every layer shows: the recorder samples kernel windows inside its budget and places them on a
roofline. On the CPU the ceilings come from the ceilings cache, or the demo measures them first
(demo_ceilings) and says so; and the budget is the demo's CPU_RECORDER_BUDGET, not the agent's 0.5%
(a CPU window costs seconds of engine time: at 0.5%, a demo's half minute of engine time affords none).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from infersight.bench.engine.switch import SwitchObserver
from infersight.demo_ceilings import demo_ceilings
from infersight.demo_recorder import recorder_rows
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig, SamplingParams
from infersight.runtime.config import resolve_dtype
from infersight.runtime.observer import EngineObserver
from infersight.workload import TASKS, WorkloadConfig, build_workload


@dataclass
class DemoConfig:
    out_dir: Path = Path("infersight-out")
    device: str = "auto"
    num_requests: int = 96
    rate_per_s: float = 8.0
    max_tokens: int = 48
    seed: int = 0
    port: int = 0  # 0: any free port on 127.0.0.1
    num_kv_blocks: int = 160
    cpu_offload_blocks: int = 64
    # The flight recorder's budget (share of engine time); None: CPU_RECORDER_BUDGET on the CPU, the
    # agent's default (0.005) on CUDA, where a window costs milliseconds.
    recorder_budget: float | None = None

    def __post_init__(self) -> None:
        if self.recorder_budget is not None and not 0.0 < self.recorder_budget < 0.5:
            raise ValueError(f"--recorder-budget must be in (0, 0.5) (a share of engine time), "
                             f"got {self.recorder_budget}")


#: The recorder's budget on a CPU demo. Measured on a 2-core CPU (load 6-8 from other work): a 4-step
#: window cost 1-4 s of engine time, in a run of ~30 s of engine time (96 requests); 10% affords two or
#: three windows, 0.5% not one once the budget is kept.
CPU_RECORDER_BUDGET = 0.1
#: What the demo's recorder assumes a window costs before it measures one, above what a 4-step window of
#: this engine was measured to cost: 0.047-0.061 s at batch 8 on the 2-core CPU (benchmarks/window_cost.py,
#: 2026-12-05), 0.034 +- 0.011 s on the H200 with graphs (BENCHMARKS.md, "The flight recorder on the H200").
#: The first window then comes after ~1 s of engine time on the CPU (budget 10%), 20 s on CUDA (0.5%):
#: inside the demo's run. The agent's default (1.0 s, the dearest window measured anywhere) would take
#: none in a run this short.
DEMO_RECORDER_INITIAL_COST_S = 0.1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 120.0) -> bytes:
    """The agent answers late while it reads a triggered capture on a loaded CPU (a minute was seen
    for a 20-step one at load 8 on 2 cores): late, not never."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback only)
        return resp.read()


class AgentProcess:
    """The sidecar as a real separate process, as a user would run it."""

    def __init__(self, ring: str | None, port: int, out_dir: Path, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(out_dir / "agent.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infersight", "agent", *(["--ring", ring] if ring else []),
             "--listen", f"127.0.0.1:{port}", "--parquet-dir", str(out_dir), "--poll-interval", "0.05",
             *(extra_args or [])],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the agent exited with code {self.proc.returncode}; see {out_dir / 'agent.log'}")
            try:
                _get(self.url + "/health", 1.0)
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("the agent did not answer on /health within 30 s")

    def json(self, path: str) -> Any:
        return json.loads(_get(self.url + path))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def run_demo(config: DemoConfig, console: Console) -> dict[str, Any]:
    device = ("cuda" if torch.cuda.is_available() else "cpu") if config.device == "auto" else config.device
    if device == "cpu":
        # Leave a core to the agent: two busy processes on oversubscribed torch threads crawl.
        torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    ring = f"infersight-demo-{os.getpid()}"
    # Before the engine and the agent start: the measurement has the cores to itself.
    engine_config = demo_engine_config(config, device)
    ceilings = demo_ceilings(out, engine_config.dtype) if device == "cpu" else None
    if ceilings is not None:
        console.print(f"roofline ceilings: {ceilings.line()}", markup=False)
    probe = ProbeObserver(ProbeConfig(ring_name=ring, task_labels=TASKS))
    # The warm-up runs unobserved: its requests are no part of the workload the agent reports on.
    switch = SwitchObserver({"off": EngineObserver(), "probes": probe}, initial="off")
    engine = Engine(engine_config, switch)
    if device.startswith("cuda"):  # the CPU has no JIT or graph capture to pay on the first requests
        warm_up(engine)
    probe.warm_profiler()  # the recorder's first window must not pay the profiler's start-up (~1 s)
    switch.select("probes")
    workload = build_workload(WorkloadConfig(num_requests=config.num_requests, rate_per_s=config.rate_per_s,
                                             max_tokens=config.max_tokens, seed=config.seed))
    # p95 rather than the default p99: 96 requests allow one p99 outlier; the demo shows up to five.
    agent = AgentProcess(ring, config.port or _free_port(), out,
                         ["--slow-quantile", "0.95", *recorder_args(config.recorder_budget, device)],
                         env=ceilings.agent_env() if ceilings is not None else None)
    try:
        _drive(engine, workload, console)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and agent.json("/api/v1/summary")["requests"] < len(workload):
            time.sleep(0.1)
        summary = agent.json("/api/v1/summary")
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        metrics = _get(agent.url + "/metrics")
        (out / "metrics.prom").write_bytes(metrics)
        every = agent.json(f"/api/v1/requests?slowest={len(workload)}")["requests"]
        slowest, flagged = every[:5], [r for r in every if r.get("slow_cause")]
        diagnosis = agent.json("/api/v1/diagnosis")
        (out / "diagnosis.json").write_text(json.dumps(diagnosis, indent=2))
    finally:
        agent.stop()
        probe.close()
    print_summary(summary, slowest, diagnosis, out, console, flagged, metrics.decode())
    from infersight.dashboards.report import write_report  # matplotlib loads only here

    console.print(f"report: {write_report(out)}")
    return summary


def recorder_args(budget: float | None, device: str) -> list[str]:
    """The agent's flight-recorder flags: on, at `budget` (None: DemoConfig.recorder_budget's default)."""
    budget = budget if budget is not None else CPU_RECORDER_BUDGET if device == "cpu" else None
    return ["--flight-recorder", *([] if budget is None else ["--recorder-budget", str(budget)]),
            "--recorder-initial-cost", str(DEMO_RECORDER_INITIAL_COST_S)]


def demo_engine_config(config: DemoConfig, device: str) -> EngineConfig:
    """The demo's engine: tiny-moe with the tiny-draft speculator, a small KV pool with CPU offload, in
    vLLM's `--dtype auto` (bfloat16 on CUDA, as `bench speculation` runs it: the demo's predicted
    speedups are checked against that bench, so both must time the same kernels)."""
    return EngineConfig(model="tiny-moe", speculative_model="tiny-draft", device=device, seed=config.seed,
                        dtype=resolve_dtype("auto", device, "tiny-moe"),
                        num_kv_blocks=config.num_kv_blocks, cpu_offload_blocks=config.cpu_offload_blocks,
                        max_num_seqs=32, max_num_batched_tokens=512,
                        # Plain probe steps, which the speedup is predicted from. 1 in 4 on CUDA (as `bench
                        # speculation`): a plain step is a ~1 ms graph replay there, and the medians need the
                        # samples. 1 in 8 on the CPU: each probe makes the draft catch up after it, and
                        # at 4 the demo's TTFT p50 rose in 3 of 3 paired runs (3.8-12.2 s against 2.4-6.8 s).
                        spec_probe_every=4 if device.startswith("cuda") else 8)


def warm_up(engine: Engine, max_tokens: int = 12) -> None:
    """Run the kinds of step the workload will run before it starts, as a server warms up before
    taking traffic: on CUDA the first prefill, verify and decode of each batch size pays Triton JIT,
    cuBLAS heuristics and a CUDA-graph capture per batch size and context-width bucket (seconds in
    all, captured here up front), which would otherwise land on the requests' TTFT. Batches of 1, 2, 4, ... max_num_seqs requests, with
    prompts of a few lengths (prefill chunks of several sizes); every request is released after."""
    engine.capture_decode_graphs()  # every batch size and width: the workload's batch size wanders
    n, gen = 1, torch.Generator().manual_seed(12345)
    vocab = engine.config.model_config.vocab_size
    while True:
        ids = [engine.add_request(torch.randint(3, vocab, (16 + 48 * (i % 4),), generator=gen).tolist(),
                                  SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
               for i in range(n)]
        while engine.has_unfinished():
            engine.step()
        for rid in ids:
            engine.release(rid)
        if n >= engine.config.max_num_seqs:
            break
        n = min(2 * n, engine.config.max_num_seqs)
    if engine.config.device.startswith("cuda"):
        torch.cuda.synchronize()


def _drive(engine: Engine, workload: list, console: Console) -> None:
    pending = list(workload)
    start = time.monotonic()
    columns = (TextColumn("[bold]requests"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("requests", total=len(workload))
        done = 0
        while pending or engine.has_unfinished():
            now = time.monotonic() - start
            while pending and pending[0].arrival_s <= now:
                r = pending.pop(0)
                engine.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.max_tokens,
                                                            ignore_eos=True, task=r.task))
            if engine.has_unfinished():
                done += len(engine.step().finished)
                bar.update(task, completed=done)
            elif pending:
                time.sleep(min(0.05, max(0.0, pending[0].arrival_s - now)))


def _predicted(s: dict[str, Any]) -> str:
    """The speedup as a prediction, with its interval and what it was estimated from."""
    if s.get("predicted_speedup") is None:
        return f"speedup not predicted ({s.get('basis', '')})"
    low, high = s["speedup_interval"]
    span = f" ({low:.2f}-{high:.2f}x)" if low is not None and high is not None else " (no interval yet)"
    return (f"predicted speedup {s['predicted_speedup']:.2f}x{span}, estimated from "
            f"{s['samples']['probe_steps']} plain probe steps")


def print_summary(summary: dict[str, Any], slowest: list[dict[str, Any]], diagnosis: dict[str, Any],
                  out: Path, console: Console, flagged: list[dict[str, Any]] | None = None,
                  metrics: str | None = None) -> None:
    """flagged: the requests the agent judged slow when they finished (slowest: the slowest overall;
    when latency climbs for everyone, the last ones are the slowest without being outliers).
    metrics: the agent's exposition at the end, for the flight recorder's roofline."""
    def fmt(v: Any, scale: float = 1.0, unit: str = "") -> str:
        return "-" if v is None else f"{v * scale:.1f}{unit}" if isinstance(v, float) else str(v)

    t = Table(title="infersight demo", show_header=False)
    t.add_row("requests", str(summary["requests"]))
    t.add_row("TTFT p50 / p99", f"{fmt(summary['ttft_seconds']['p50'], 1e3, ' ms')} / {fmt(summary['ttft_seconds']['p99'], 1e3, ' ms')}")
    t.add_row("e2e p50 / p99", f"{fmt(summary['e2e_seconds']['p50'], 1e3, ' ms')} / {fmt(summary['e2e_seconds']['p99'], 1e3, ' ms')}")
    pc = summary["prefix_cache"]
    t.add_row("prefix cache hit rate", f"tokens {pc['token_hit_rate']:.1%}, requests {pc['request_hit_rate']:.1%}")
    kv = summary["kv"]
    t.add_row("KV", f"{kv['preemptions']} preemptions, {kv['evictions']} evictions, {kv['offloads']} offloads, "
                    f"{kv['recomputed_tokens']} tokens recomputed")
    for task, s in sorted(summary["spec"]["by_task"].items()):
        t.add_row(f"speculation, {task}", f"accept {fmt(s['accept_rate'], 100, '%')} (measured), tau "
                                           f"{fmt(s['mean_accepted_length'])}, {_predicted(s)}")
    imb = [f"L{layer['layer']} {fmt(layer['max_over_mean'])}x" for layer in summary["moe"]["layers"]]
    t.add_row("MoE max/mean load", ", ".join(imb) or "-")
    gpu = summary.get("gpu", {})
    phases = ", ".join(f"{p['phase']} {p['field'].replace('_ratio', '')} {p['mean']:.2f}"
                       for p in gpu.get("phase_breakdown", []))
    t.add_row("GPU", phases or gpu.get("status", "-").split(" (")[0])  # the details are in summary.json
    t.add_row("GPU energy", summary.get("cost", {}).get("energy", {}).get("headline", "-"))
    for name, value in recorder_rows(metrics):
        t.add_row(name, value)
    t.add_row("dropped probe events", str(summary["dropped_events"]))
    console.print(t)
    s = Table(title=f"slowest requests (s); slow means {summary.get('slow_rule', 'above the rolling p99')}")
    for col in ("id", "task", "prompt", "queue", "prefill", "stall", "decode", "e2e", "cause"):
        s.add_column(col)
    for r in slowest:
        s.add_row(str(r["request_id"]), r["task"], str(r["prompt_tokens"]), fmt(r["queue_s"]), fmt(r["prefill_s"]),
                  fmt(r["preemption_stall_s"]), fmt(r["decode_s"]), fmt(r["e2e_s"]), r["slow_cause"] or "-")
    console.print(s)
    for r in flagged if flagged is not None else [r for r in slowest if r.get("slow_cause")]:
        console.print(f"- slow request {r['request_id']} ({r['task']}, e2e {fmt(r['e2e_s'])} s), "
                      f"{r['slow_cause']}: {r['slow_detail']}", markup=False)
    for f in diagnosis["findings"][:5]:
        console.print(f"- {f['message']}", markup=False)
    for r in diagnosis["speculation_recommendations"]:
        console.print(f"- {r['task']}: {r['action']}: {r['reason']}", markup=False)
    console.print(f"written: {out}/summary.json, requests.parquet, metrics.prom, diagnosis.json")
