"""`infersight serve` under constant load for a long time: do throughput, latency and memory stay flat?

Issue 32 item 5. One `infersight serve` (its engine process included) and one `infersight agent` beside it
with everything on by default (the flight recorder, OTLP span export to a local sink, GPU telemetry where
there is a GPU: bench serving's `full` arm), and closed-loop clients (bench serving's: each sends its next
streamed request when the last one ends) for --duration seconds, read in windows of --window-s. Per window,
all measured: the client's output tokens/s and requests/s, TTFT p50/p99 and ITL p50/p99 (the client's
clock), and VmRSS (with its RssAnon: the process's own heap, and RssShmem: shared pages such as the probe
ring's, bounded by the ring's size) and CPU cores (utime + stime over the window, /proc) of the HTTP front
end, the engine process and the agent.

The summary fits a line to each figure over the windows after --settle-s (least squares against the
window's midpoint) and gives its change per 10 minutes with a 95% interval (t x the slope's standard error),
and the median of the first and the last --compare windows. "Flat" here means the interval holds 0 or the
change over the whole run is within the windows' own spread (the median absolute deviation around the
line): the reader sees both numbers.

    python benchmarks/serving_soak.py --duration 1800 --window-s 60            # CPU, tiny-moe, 8 clients
    python benchmarks/serving_soak.py --device cuda --model llama-1b-shape --clients 48 --max-tokens 96
    # where the engine process's Python heap grows (tracemalloc there: it slows the engine)
    python benchmarks/serving_soak.py --duration 1500 --settle-s 300 --traced-engine engine_growth.txt

Prints one line per window, then one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infersight.bench.agent import stop_agent  # noqa: E402
from infersight.bench.serving.process_cpu import process_cpu_s, process_memory_mb, spawned_children  # noqa: E402
from infersight.bench.serving.otlp_sink import OtlpSink  # noqa: E402
from infersight.bench.serving.processes import agent_cmd as bench_agent_cmd, agent_figures, free_port, wait_health  # noqa: E402
from infersight.bench.serving.clients import phase_figures, run_phase  # noqa: E402
from infersight.bench.serving.config import ServingBenchConfig  # noqa: E402

FIGURES = ("tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s",
           "front_rss_mb", "engine_rss_mb", "agent_rss_mb", "engine_anon_mb", "engine_shmem_mb", "agent_anon_mb",
           "front_cores", "engine_cores", "agent_cores")


def trend(t_s: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Least-squares line of y on t: change per 10 minutes with its 95% interval, and the median absolute
    deviation of the windows around the line (their spread)."""
    ok = np.isfinite(y)
    t_s, y = t_s[ok], y[ok]
    if len(y) < 3:
        return {"per_10min": float("nan"), "low": float("nan"), "high": float("nan"), "spread": float("nan")}
    fit = stats.linregress(t_s, y)
    half = stats.t.ppf(0.975, len(y) - 2) * fit.stderr
    resid = y - (fit.intercept + fit.slope * t_s)
    return {"per_10min": float(fit.slope * 600), "low": float((fit.slope - half) * 600),
            "high": float((fit.slope + half) * 600), "spread": float(np.median(np.abs(resid - np.median(resid))))}


def kept_rows(agent_url: str | None) -> dict[str, float]:
    """What the agent's retention holds now (/api/v1/summary's retention block); -1 when it did not answer."""
    if agent_url is None:
        return {"kept_requests": -1, "kept_bytes": -1}
    try:
        with urllib.request.urlopen(agent_url + "/api/v1/summary", timeout=30) as r:  # noqa: S310 (loopback)
            kept = json.loads(r.read()).get("retention", {})
    except (OSError, ValueError):
        return {"kept_requests": -1, "kept_bytes": -1}
    return {"kept_requests": kept.get("requests", -1), "kept_bytes": kept.get("bytes", -1)}


def soak_agent_cmd(arm: str, ring: str, port: int, out_dir: Path, sink: OtlpSink) -> list[str]:
    if arm == "recorder_otlp":
        return bench_agent_cmd("agent_recorder", ring, port, out_dir, sink) + ["--otlp-endpoint", sink.url]
    if arm == "recorder_parquet":
        return bench_agent_cmd("agent_recorder", ring, port, out_dir, sink) + ["--parquet-dir", str(out_dir / "parquet")]
    return bench_agent_cmd(arm, ring, port, out_dir, sink)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of load (default 30 minutes)")
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--settle-s", type=float, default=120.0, help="left out of the fits (start-up, first windows)")
    ap.add_argument("--compare", type=int, default=5, help="windows at each end compared by their medians")
    ap.add_argument("--arm", default="full", choices=("none", "agent", "agent_recorder", "full", "recorder_otlp",
                                                      "recorder_parquet"),
                    help="what runs beside serve: bench serving's arms (default full: recorder, OTLP export, Parquet, "
                         "GPU telemetry), or the recorder with only one of OTLP export and Parquet (to tell them apart)")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="FLAG")
    ap.add_argument("--agent-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for the agent alone (e.g. MALLOC_ARENA_MAX=2), repeatable")
    ap.add_argument("--traced-agent", type=Path, metavar="FILE",
                    help="run the agent under benchmarks/agent_traced.py (tracemalloc; it slows the agent) and write "
                         "its growth by allocation site to FILE: first snapshot after --settle-s, then every 5 windows")
    ap.add_argument("--traced-engine", type=Path, metavar="FILE",
                    help="tracemalloc in serve's engine process (benchmarks/traced_engine/sitecustomize.py; it slows the "
                         "engine): its heap's growth by allocation site to FILE, first after --settle-s, then every 5 "
                         "windows")
    ap.add_argument("--engine-heap", type=Path, metavar="FILE",
                    help="glibc's mallinfo2 in serve's engine process (benchmarks/engine_heap/sitecustomize.py): its "
                         "arenas' bytes in use and free, and its RssAnon, every 15 s to FILE")
    args = ap.parse_args()
    if args.traced_engine and args.engine_heap:
        ap.error("--traced-engine and --engine-heap each load their own sitecustomize: use one at a time")

    out_dir = Path(tempfile.mkdtemp(prefix="infersight-serving-soak-"))
    ring, port = f"infersight-soak-{free_port()}", free_port()
    url = f"http://127.0.0.1:{port}"
    config = ServingBenchConfig(model=args.model, device=args.device, clients=args.clients, max_tokens=args.max_tokens,
                                phase_s=args.window_s, warmup_s=0.0)
    serve_log = open(out_dir / "serve.log", "w")
    serve_env = dict(os.environ)
    if args.traced_engine:
        serve_env.update(INFERSIGHT_TRACED_ENGINE=str(args.traced_engine.resolve()),
                         INFERSIGHT_TRACED_FIRST_S=str(args.settle_s), INFERSIGHT_TRACED_EVERY_S=str(5 * args.window_s),
                         PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "benchmarks" / "traced_engine"),
                                                                  os.environ.get("PYTHONPATH")])))
    if args.engine_heap:
        serve_env.update(INFERSIGHT_ENGINE_HEAP=str(args.engine_heap.resolve()),
                         PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "benchmarks" / "engine_heap"),
                                                                  serve_env.get("PYTHONPATH")])))
    serve = subprocess.Popen([sys.executable, "-m", "infersight", "serve", "--listen", f"127.0.0.1:{port}", "--model",
                              args.model, "--device", args.device, "--ring", ring, *args.serve_arg],
                             stdout=serve_log, stderr=subprocess.STDOUT, env=serve_env)
    sink = OtlpSink()
    agent = None
    rows = []
    try:
        wait_health(url, serve, "infersight serve", out_dir / "serve.log", timeout_s=600)
        if args.arm != "none":
            aport = free_port()
            cmd = soak_agent_cmd(args.arm, ring, aport, out_dir, sink)
            if args.traced_agent:
                cmd[1:3] = [str(REPO / "benchmarks" / "agent_traced.py"), "--out", str(args.traced_agent.resolve()),
                            "--first-s", str(args.settle_s), "--every-s", str(5 * args.window_s), "--"]
            env = {**os.environ, **dict(kv.split("=", 1) for kv in args.agent_env)}
            with open(out_dir / "agent.log", "w") as agent_log:
                agent = subprocess.Popen(cmd, stdout=agent_log, stderr=subprocess.STDOUT, env=env)
            wait_health(f"http://127.0.0.1:{aport}", agent, "infersight agent", out_dir / "agent.log")
        agent_url = f"http://127.0.0.1:{aport}" if agent is not None else None
        engine = next(iter(spawned_children(serve.pid)), None)
        pids = {"front": serve.pid, "engine": engine, "agent": agent.pid if agent is not None else None}
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < args.duration:
            cpu0 = {k: process_cpu_s(p) if p else float("nan") for k, p in pids.items()}
            w0 = time.monotonic()
            records, t0, t1 = run_phase(url, config, seed=n)
            wall = time.monotonic() - w0
            tok = pd.DataFrame(records.tokens, columns=["request", "t_s"])
            req = pd.DataFrame(records.requests, columns=["request", "sent_s", "first_s", "done_s", "tokens", "status"])
            row = {"window": n, "t_s": (t0 + t1) / 2 - start, **phase_figures(tok, req, t0, t1)}
            for k, p in pids.items():
                memory = process_memory_mb(p)
                row[f"{k}_rss_mb"] = memory["rss"]
                row[f"{k}_anon_mb"], row[f"{k}_shmem_mb"] = memory["anon"], memory["shmem"]
                row[f"{k}_cores"] = ((process_cpu_s(p) - cpu0[k]) / wall) if p else float("nan")
            row.update(kept_rows(agent_url))
            # The recorder's windows so far (a window profiles the engine: its memory may step at one).
            row["recorder_windows"] = agent_figures(agent_url)["windows"] if agent_url else float("nan")
            rows.append(row)
            print(f"window {n:3d} t={row['t_s']:7.0f} s {row['tokens_per_s']:8.1f} tok/s TTFT p99 "
                  f"{row['ttft_p99_s'] * 1e3:7.1f} ms ITL p99 {row['itl_p99_s'] * 1e3:6.1f} ms RSS front/engine/agent "
                  f"{row['front_rss_mb']:.0f}/{row['engine_rss_mb']:.0f}/{row['agent_rss_mb']:.0f} MB cores "
                  f"{row['front_cores']:.2f}/{row['engine_cores']:.2f}/{row['agent_cores']:.2f} errors {row['errors']} "
                  f"kept {row['kept_requests']} ({row['kept_bytes'] / 2**20:.1f} MiB) engine anon/shmem "
                  f"{row['engine_anon_mb']:.0f}/{row['engine_shmem_mb']:.0f} MB windows {row['recorder_windows']:.0f}",
                  flush=True)
            n += 1
    finally:
        for proc in (agent, serve):
            if proc is not None:
                stop_agent(proc)  # SIGTERM, then SIGKILL after 15 s
        serve_log.close()
        sink.close()
    frame = pd.DataFrame(rows)
    fit = frame[frame["t_s"] >= args.settle_s]
    k = args.compare
    summary = {f: {**trend(fit["t_s"].to_numpy(np.float64), fit[f].to_numpy(np.float64)),
                   "first": float(fit[f].head(k).median()), "last": float(fit[f].tail(k).median())}
               for f in FIGURES if f in frame}
    report = {"measured": True, "how": "client clock per window; /proc for RSS and CPU; fits after settle_s",
              "config": vars(args), "windows": len(frame), "errors": int(frame["errors"].sum()),
              "otlp_exports": sink.exports, "trends": summary, "rows": frame.to_dict("records"), "out_dir": str(out_dir)}
    for f, s in summary.items():
        print(f"{f:15s} first {s['first']:10.4g} last {s['last']:10.4g} per 10 min {s['per_10min']:+.4g} "
              f"[{s['low']:+.4g}, {s['high']:+.4g}] spread {s['spread']:.4g}")
    print(json.dumps(report, default=lambda v: str(v) if isinstance(v, Path) else float(v)))  # paths: the traced files
    return 0


if __name__ == "__main__":
    sys.exit(main())
