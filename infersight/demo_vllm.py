"""`infersight demo --engine vllm`: a real vLLM with infersight's plugin, middleware and KV events,
the agent beside it, and the same task-labelled workload as the reference demo, over HTTP.

It builds a tiny random-weight Llama offline (no hub), starts vLLM from its own environment
(``make vllm-env``) with the stat-logger plugin and expert counter (entry points, loaded by vLLM
itself), ``--middleware infersight.vllm.middleware.InfersightMiddleware``, KV cache events to the
agent and its profiler directory, then replays the workload and prints the reference demo's summary.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from infersight.demo import AgentProcess, _free_port, _get, print_summary
from infersight.vllm.client_workload import replay
from infersight.vllm.launch import VllmServer, VllmServerConfig, build_tiny_model
from infersight.workload import TASKS, WorkloadConfig, build_workload

MIDDLEWARE = "infersight.vllm.middleware.InfersightMiddleware"


@dataclass
class VllmDemoConfig:
    out_dir: Path = Path("infersight-out")
    num_requests: int = 96
    rate_per_s: float = 8.0
    max_tokens: int = 48
    seed: int = 0
    arch: str = "llama"
    model_dir: Path | None = None  # default: a cache folder under ~/.cache/infersight
    otlp_endpoint: str | None = None  # export the joined vLLM spans there (e.g. Phoenix), with the receiver on
    startup_timeout_s: float = 600


def _model_dir(config: VllmDemoConfig) -> Path:
    if config.model_dir is not None:
        return config.model_dir
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "infersight"
    return cache / f"vllm-tiny-{config.arch}-{config.seed}"


def run_vllm_demo(config: VllmDemoConfig, console: Console) -> dict[str, Any]:
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    console.print("building the tiny model (offline) ...")
    model = build_tiny_model(_model_dir(config), config.arch, config.seed)
    ports = {k: _free_port() for k in ("agent", "vllm", "kv", "replay", "otlp")}
    profiler_dir = out / "vllm-profiles"
    profiler_dir.mkdir(exist_ok=True)
    # vLLM's rings: the API server's (named here) and each worker's (infersight-vllm-worker-<pid>).
    prefix = f"infersight-vllm-demo{os.getpid()}-"
    vllm_url = f"http://127.0.0.1:{ports['vllm']}"
    agent_args = ["--discover-prefix", "infersight-vllm-", "--vllm-kv-events", f"tcp://127.0.0.1:{ports['kv']}",
                  "--vllm-url", vllm_url, "--vllm-profiler-dir", str(profiler_dir), "--model-name", "tiny-llama"]
    vllm_config = VllmServerConfig(
        model=str(model), port=ports["vllm"], served_model_name="tiny-llama", max_num_seqs=32,
        kv_events=f"tcp://127.0.0.1:{ports['kv']}", kv_events_replay=f"tcp://127.0.0.1:{ports['replay']}",
        profiler_dir=str(profiler_dir), middleware=[MIDDLEWARE],
        env={"INFERSIGHT_RING": prefix + "api", "INFERSIGHT_TASK_LABELS": ",".join(TASKS)})
    if config.otlp_endpoint:
        agent_args += ["--otlp-endpoint", config.otlp_endpoint, "--otlp-receiver", f"127.0.0.1:{ports['otlp']}"]
        vllm_config.otlp_traces_endpoint = f"http://127.0.0.1:{ports['otlp']}/v1/traces"
    agent = AgentProcess(None, ports["agent"], out, extra_args=agent_args)
    server = VllmServer(vllm_config, out / "vllm.log")
    try:
        console.print(f"starting vLLM (log: {out / 'vllm.log'}; about a minute warm, longer the first time) ...")
        server.start().wait_ready(config.startup_timeout_s)
        workload = build_workload(WorkloadConfig(num_requests=config.num_requests, rate_per_s=config.rate_per_s,
                                                 max_tokens=config.max_tokens, seed=config.seed))
        columns = (TextColumn("[bold]requests"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("requests", total=len(workload))
            results = replay(server.url, "tiny-llama", workload, on_done=lambda _: bar.advance(task))
        failed = [r for r in results if r.status != 200]
        if failed:
            console.print(f"{len(failed)} requests failed, e.g.: {failed[0].error}", markup=False)
        ok = len(results) - len(failed)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and agent.json("/api/v1/summary")["requests"] < ok:
            time.sleep(0.2)
        summary = agent.json("/api/v1/summary")
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        (out / "metrics.prom").write_bytes(_get(agent.url + "/metrics"))
        (out / "vllm-metrics.prom").write_bytes(_get(server.url + "/metrics"))
        slowest = agent.json("/api/v1/requests?slowest=5")["requests"]
        diagnosis = agent.json("/api/v1/diagnosis")
        (out / "diagnosis.json").write_text(json.dumps(diagnosis, indent=2))
    finally:
        server.stop()
        agent.stop()
    print_summary(summary, slowest, diagnosis, out, console)
    console.print(f"also written: {out}/vllm-metrics.prom (vLLM's own /metrics, to compare), vllm.log")
    from infersight.dashboards.report import write_report  # matplotlib loads only here

    console.print(f"report: {write_report(out)}")
    return summary
