"""What the flight recorder's windows cost a real vLLM, measured by the agent itself (CPU build here).

One vLLM (tiny random Llama, the stat-logger plugin loaded, `--profiler-config` torch without stacks,
optionally "ignore_frontend": true) serves long streamed requests one after another for --seconds;
an in-process agent with --flight-recorder (budget --budget, windows of --steps steps) takes windows
through /start_profile {"max_iterations": N} and measures each one's cost on the plugin's STEP
records against the steps before it (agent.recorder_budget.window_cost, agent.recorder_vllm).
Printed: each window's cost, noise floor, base step period and how long the profiler calls took;
the median cost in seconds and in steps; the amortised cost over engine time against the budget;
and the interval the budget settled on (engine seconds between windows). The first window pays
torch's one-time profiler initialisation and is reported apart.

    python benchmarks/vllm_recorder_cost.py --seconds 60 --budget 0.05 --ignore-frontend

Prints `key: value` lines, then one JSON object as the last line. Needs `make vllm-env`.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import httpx

from infersight.agent.config import AgentConfig
from infersight.agent.capture.config import CaptureConfig
from infersight.sources.vllm.http_config import VllmHttpConfig
from infersight.agent.recorder.config import RecorderConfig
from infersight.agent.service import Agent
from infersight.vllm.launch import VllmServer
from vllm_window_cost import profiled_tiny_server, report


def stream(url: str, stop: threading.Event, tokens: int) -> None:
    body = {"model": "tiny-llama", "prompt": "the cache block token " * 4, "max_tokens": tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=300) as client:
        while not stop.is_set():
            with client.stream("POST", url + "/v1/completions", json=body) as resp:
                for _ in resp.iter_lines():
                    pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="streaming time with the recorder on")
    p.add_argument("--budget", type=float, default=0.05)
    p.add_argument("--steps", type=int, default=4, help="steps per window (max_iterations)")
    p.add_argument("--tokens", type=int, default=1500, help="tokens per request")
    p.add_argument("--ignore-frontend", action="store_true", help='vLLM\'s profiler "ignore_frontend": true')
    args = p.parse_args()
    root, prof, config = profiled_tiny_server("infersight-vllm-recorder-", ignore_frontend=args.ignore_frontend)
    recorder = RecorderConfig(budget=args.budget, window_steps=args.steps, min_interval_s=0.0,
                              preemption_storm=None, step_jump=None)
    with VllmServer(config, log_path=root / "vllm.log") as server:
        agent = Agent(AgentConfig(rings=[f"infersight-vllm-{server.proc.pid}"], port=0, poll_interval_s=0.05,
                                  retry_interval_s=0.5, flight_recorder=recorder,
                                  vllm_server=VllmHttpConfig(url=server.url, profiler_dir=str(prof), metrics_interval_s=2.0),
                                  captures=CaptureConfig(min_interval_s=0, token="unused")))
        runner = threading.Thread(target=agent.run, daemon=True)
        runner.start()
        stop = threading.Event()
        client = threading.Thread(target=stream, args=(server.url, stop, args.tokens), daemon=True)
        client.start()
        time.sleep(args.seconds)
        stop.set()
        client.join(timeout=300)
        time.sleep(3)  # idle: no window starts; one in flight ends
        agent.stop()
        runner.join(timeout=120)
    windows = [w for w in agent.recorder.store.recent() if w["kind"] == "window"]
    measured = [w for w in windows if w.get("cost")]
    rec = agent.state.recorder_summary or {}
    rows = [{"cost_s": w["cost"]["cost_s"], "noise_s": w["cost"]["noise_s"], "base_period_s": w["cost"]["base_period_s"],
             "charged_steps": w["cost"]["charged_steps"], **{k: v for k, v in w.get("profiler", {}).items()
                                                             if not k.endswith("mono_ns")}} for w in measured]
    later = rows[1:] or rows
    median = statistics.median(r["cost_s"] for r in later) if later else float("nan")
    base = statistics.median(r["base_period_s"] for r in later) if later else float("nan")
    out = {"ignore_frontend": args.ignore_frontend, "budget": args.budget, "steps": args.steps,
           "windows": len(windows), "measured": len(measured), "first_window": rows[0] if rows else None,
           "cost_median_s": median, "noise_median_s": statistics.median(r["noise_s"] for r in later) if later else None,
           "base_period_s": base, "cost_in_steps": median / base if later else None,
           "engine_s": rec.get("engine_seconds"), "cost_s": rec.get("cost_seconds"), "cost_ratio": rec.get("cost_ratio"),
           "interval_engine_s": rec.get("window_interval_engine_s"), "rows": rows}
    report(out, ("windows", "measured", "cost_median_s", "noise_median_s", "base_period_s", "cost_in_steps",
                 "engine_s", "cost_ratio", "budget", "interval_engine_s"),
           [f"cost {r['cost_s']:.3f} s (noise {r['noise_s']:.3f}, base {r['base_period_s'] * 1e3:.2f} ms, "
            f"{r['charged_steps']} steps), start call {r.get('start_call_s')} s, stop call {r.get('stop_call_s')} s"
            for r in rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
