"""What observing costs the client: `infersight bench serving`.

One `infersight serve` process (probes on, as always) is loaded by closed-loop HTTP clients that
stream /v1/completions, as a user's clients would. Phases of --phase-s alternate between arms:

    none            no agent beside the engine (the reference)
    none_again      the same, a second time in the round: the A/A noise floor
    agent           `infersight agent` reading the engine's ring
    agent_recorder  the same with --flight-recorder
    full            agent + recorder + OTLP span export to a local sink + GPU telemetry (auto)

Every round runs each arm once, in an order rotated by the round (drift spreads over every arm), and
each arm's figure is divided by the `none` phase of its own round (drift between rounds cancels).
All figures are measured by the clients' clock: output tokens/s (every streamed token whose chunk's
arrival lies in the phase's window; a chunk's tokens are the rise of its usage.completion_tokens, vLLM's
continuous_usage_stats, as the server merges the tokens of a client it fell behind on), requests/s
(completions in the window), TTFT and ITL p50/p99 of the requests that started in the window (ITL:
the gaps between a request's chunks, as vLLM's serving benchmark takes them). The first --warmup-s of
each phase are left out (an agent starting up, the clients ramping). The report gives, per arm, the
median over rounds of each ratio, and beside it the A/A floor: the median and the largest |1 - ratio| of `none_again`.

Frames:
  tokens    arm, round, request, t_s (client monotonic seconds of each streamed token; a chunk's tokens share its t_s)
  requests  arm, round, request, sent_s, first_s, done_s, tokens, status
"""
from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from infersight.bench.agent import stop_agent
from infersight.bench.serving.otlp_sink import OtlpSink
from infersight.bench.serving.process_cpu import cores_used, process_cpu_s, process_memory_mb, spawned_children, thread_cpu_s
from infersight.bench.serving.clients import phase_figures, run_phase
from infersight.bench.serving.config import ServingBenchConfig
from infersight.bench.serving.processes import agent_cmd, agent_figures, free_port, start_serve, wait_health
from infersight.bench.serving.report import summarise


def bench_serving(config: ServingBenchConfig, log: Any = print) -> dict[str, Any]:
    """Run every round and arm; returns the report (summarise) with the raw frames under "frames"."""
    out_dir = Path(tempfile.mkdtemp(prefix="infersight-bench-serving-"))
    ring = f"infersight-bench-serving-{free_port()}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve_log = open(out_dir / "serve.log", "w")
    serve = start_serve(config, ring, port, serve_log)
    sink = OtlpSink()
    tokens, requests, phases = [], [], []
    try:
        wait_health(url, serve, "infersight serve", out_dir / "serve.log")
        run_phase(url, ServingBenchConfig(**{**config.__dict__, "phase_s": 2.0 + config.warmup_s}), seed=-1)
        for rnd in range(config.rounds):
            order = list(config.arms[rnd % len(config.arms):] + config.arms[:rnd % len(config.arms)])
            for arm in order:
                agent, agent_url = None, ""
                if arm.startswith(("agent", "full")):
                    aport = free_port()
                    agent_url = f"http://127.0.0.1:{aport}"
                    with open(out_dir / f"agent_{rnd}_{arm}.log", "w") as agent_log:
                        agent = subprocess.Popen([*agent_cmd(arm, ring, aport, out_dir, sink), *config.agent_args],
                                                 stdout=agent_log,
                                                 stderr=subprocess.STDOUT)
                    wait_health(agent_url, agent, "infersight agent", out_dir / f"agent_{rnd}_{arm}.log")
                try:
                    engine_pid = next(iter(spawned_children(serve.pid)), None)  # serve's engine process, if split
                    cpu_before = _cpu_reading(serve.pid, engine_pid, agent.pid if agent is not None else None)
                    records, t0, t1 = run_phase(url, config, seed=config.seed * 1000 + rnd)
                    cpu = _cpu_cores(cpu_before, _cpu_reading(serve.pid, engine_pid,
                                                              agent.pid if agent is not None else None))
                    for who, pid in (("serve", serve.pid), ("engine", engine_pid),
                                     ("agent", agent.pid if agent is not None else None)):
                        cpu.update({f"{who}_{k}_mb": v for k, v in process_memory_mb(pid).items()})
                    recorder = agent_figures(agent_url) if agent is not None else {}
                finally:
                    if agent is not None:
                        stop_agent(agent)
                tok = pd.DataFrame(records.tokens, columns=["request", "t_s"]).assign(arm=arm, round=rnd)
                req = pd.DataFrame(records.requests, columns=["request", "sent_s", "first_s", "done_s", "tokens",
                                                              "status"]).assign(arm=arm, round=rnd)
                figures = phase_figures(tok, req, t0, t1)
                phases.append({"arm": arm, "round": rnd, "t0_s": t0, "t1_s": t1, **figures,
                               "recorder_cost_ratio": recorder.get("cost_ratio", float("nan")),
                               "recorder_windows": recorder.get("windows", float("nan")), **cpu})
                tokens.append(tok)
                requests.append(req)
                log(f"round {rnd} {arm:<15} {figures['tokens_per_s']:9.1f} tok/s {figures['requests_per_s']:7.2f} req/s "
                    f"TTFT p50 {figures['ttft_p50_s'] * 1e3:7.1f} ms ITL p50 {figures['itl_p50_s'] * 1e3:6.1f} ms "
                    f"serve RSS {cpu['serve_rss_mb']:.0f} MB (anon {cpu['serve_anon_mb']:.0f}, shared {cpu['serve_shmem_mb']:.0f}), "
                    f"its engine process {cpu['engine_rss_mb']:.0f} MB (anon {cpu['engine_anon_mb']:.0f}, shared "
                    f"{cpu['engine_shmem_mb']:.0f})")
    finally:
        sink.close()
        stop_agent(serve)
        serve_log.close()
    report = summarise(pd.DataFrame(phases), config)
    report["frames"] = {"tokens": pd.concat(tokens, ignore_index=True) if tokens else pd.DataFrame(),
                        "requests": pd.concat(requests, ignore_index=True) if requests else pd.DataFrame()}
    report["out_dir"] = str(out_dir)
    return report


def _cpu_reading(serve_pid: int, engine_pid: int | None, agent_pid: int | None) -> dict[str, Any]:
    """serve's CPU counts its engine process's (when split: serve.engine_process); its threads are listed
    with the engine's prefixed "engine:"."""
    engine = process_cpu_s(engine_pid) if engine_pid is not None else 0.0
    threads = thread_cpu_s(serve_pid)
    if engine_pid is not None:
        threads.update({f"engine:{k}": v for k, v in thread_cpu_s(engine_pid).items()})
    return {"wall": time.monotonic(), "serve": process_cpu_s(serve_pid) + engine, "engine": engine,
            "serve_threads": threads, "agent": process_cpu_s(agent_pid) if agent_pid is not None else float("nan"),
            "clients": process_cpu_s(os.getpid())}


def _cpu_cores(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Cores used over a phase (warm-up included) by serve (its engine process included), the engine process
    alone (0 when serve runs it in-process), serve's four busiest threads, the agent and the clients (this
    process): measured from /proc, to put a client-side loss on a part."""
    wall = after["wall"] - before["wall"]
    return {"serve_cores": (after["serve"] - before["serve"]) / wall,
            "engine_cores": (after["engine"] - before["engine"]) / wall,
            "agent_cores": (after["agent"] - before["agent"]) / wall,
            "client_cores": (after["clients"] - before["clients"]) / wall,
            "serve_top_threads": cores_used(before["serve_threads"], after["serve_threads"], wall, top=4)}


