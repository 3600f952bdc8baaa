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

import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from infersight.bench.agent import stop_agent
from infersight.bench.process_cpu import cores_used, process_cpu_s, process_memory_mb, spawned_children, thread_cpu_s

ARMS = ("none", "none_again", "agent", "agent_recorder", "full")
REFERENCE = "none"


@dataclass(frozen=True)
class ServingBenchConfig:
    model: str = "tiny-moe"
    device: str = "cpu"
    dtype: str = "auto"
    clients: int = 8
    max_tokens: int = 32
    prompt_chars: tuple[int, int] = (32, 400)
    phase_s: float = 20.0
    warmup_s: float = 3.0
    rounds: int = 5
    arms: tuple[str, ...] = ARMS
    seed: int = 0
    serve_args: tuple[str, ...] = ()  # more `infersight serve` flags (the engine's, e.g. --scheduler-delay-factor)
    agent_args: tuple[str, ...] = ()  # more `infersight agent` flags for every agent arm (e.g. --recorder-initial-cost)

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or REFERENCE not in self.arms:
            raise ValueError(f"arms are some of {', '.join(ARMS)} and include {REFERENCE!r}; got {list(self.arms)}")
        if self.phase_s <= self.warmup_s or self.warmup_s < 0:
            raise ValueError(f"--phase-s ({self.phase_s}) must exceed --warmup-s ({self.warmup_s}) >= 0")
        if self.clients < 1 or self.rounds < 1 or self.max_tokens < 1:
            raise ValueError("--clients, --rounds and --max-tokens are at least 1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProcessFailed(RuntimeError):
    """A process the bench started exited or never answered; the message ends with its log's last line."""


def _last_line(log_path: Path) -> str:
    try:
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def _wait_health(url: str, proc: subprocess.Popen, what: str, log_path: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            # The process's own last word, so the bench's one line says why (the run that lost the
            # H200 full arm printed only an exit code).
            raise ProcessFailed(f"{what} exited with code {proc.returncode}: {_last_line(log_path)} (log: {log_path})")
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()  # noqa: S310 (loopback)
            return
        except OSError:
            time.sleep(0.2)
    raise ProcessFailed(f"{what} did not answer on /health within {timeout_s:.0f} s (log: {log_path})")


class OtlpSink:
    """A local OTLP/HTTP endpoint for span export (the `full` arm's; the soak's): answers every export
    200 and counts exports and bytes; with keep_bodies, also keeps each export's (path, body)."""

    def __init__(self, keep_bodies: bool = False) -> None:
        sink = self
        self.exports = self.bytes = 0
        self.bodies: list[tuple[str, bytes]] | None = [] if keep_bodies else None

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.exports, sink.bytes = sink.exports + 1, sink.bytes + len(body)
                if sink.bodies is not None:
                    sink.bodies.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class PhaseRecords:
    tokens: list[tuple[int, float]] = field(default_factory=list)  # (request, t_s)
    requests: list[tuple[int, float, float, float, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _stream_one(url: str, model: str, prompt: str, max_tokens: int, rid: int, out: PhaseRecords) -> None:
    """One streamed completion; each chunk's tokens (the rise of its usage.completion_tokens: vLLM's
    continuous_usage_stats, since a chunk may carry several) timed on its arrival."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True, "continuous_usage_stats": True}}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                 headers={"content-type": "application/json"})
    sent, first, times, status = time.monotonic(), float("nan"), [], 0
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:  # noqa: S310 (the bench's own server)
            status = resp.status
            so_far = 0
            for line in resp:
                if line.startswith(b"data: {"):
                    now = time.monotonic()
                    chunk = json.loads(line[6:])
                    if chunk["choices"]:  # the last chunk (usage only) repeats the finish chunk's count
                        tokens = chunk["usage"]["completion_tokens"]
                        times.extend([now] * (tokens - so_far))
                        so_far = tokens
    except (OSError, ValueError) as exc:
        status = getattr(exc, "code", 0) or -1
    done = time.monotonic()
    if times:
        first = times[0]
    with out.lock:
        out.tokens.extend((rid, t) for t in times)
        out.requests.append((rid, sent, first, done, len(times), status))


def _prompts(config: ServingBenchConfig, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = "the of a model cache token decode prefill batch request expert block layer".split()
    out = []
    for _ in range(n):
        size = rng.randint(*config.prompt_chars)
        text = ""
        while len(text) < size:
            text += rng.choice(words) + " "
        out.append(text[:size])
    return out


def run_phase(url: str, config: ServingBenchConfig, seed: int) -> tuple[PhaseRecords, float, float]:
    """Closed loop: each client sends its next request when the last one ends, until phase_s has
    passed; returns the records and the measured window (client monotonic seconds)."""
    records = PhaseRecords()
    start = time.monotonic()
    window = (start + config.warmup_s, start + config.phase_s)
    counter = iter(range(1 << 30))
    lock = threading.Lock()
    prompts = _prompts(config, 512, seed)

    def client() -> None:
        while time.monotonic() < window[1]:
            with lock:
                rid = next(counter)
            _stream_one(url, config.model, prompts[rid % len(prompts)], config.max_tokens, rid, records)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(config.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, window[0], window[1]


def phase_figures(tokens: pd.DataFrame, requests: pd.DataFrame, t0: float, t1: float) -> dict[str, float]:
    """One phase's client-side figures over the window [t0, t1) (frames: module docstring)."""
    span = t1 - t0
    in_window = tokens[(tokens["t_s"] >= t0) & (tokens["t_s"] < t1)]
    ok = requests[requests["status"] == 200]
    done = ok[(ok["done_s"] >= t0) & (ok["done_s"] < t1)]
    started = ok[(ok["sent_s"] >= t0) & (ok["sent_s"] < t1)]
    ttft = (started["first_s"] - started["sent_s"]).to_numpy(np.float64)
    chunks = tokens[tokens["request"].isin(started["request"])].drop_duplicates()  # a chunk's tokens share its t_s
    gaps = chunks.sort_values(["request", "t_s"]).groupby("request")["t_s"].diff().dropna().to_numpy(np.float64)

    def pct(a: np.ndarray, q: float) -> float:
        return float(np.percentile(a, q)) if len(a) else float("nan")

    return {"tokens_per_s": len(in_window) / span, "requests_per_s": len(done) / span,
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99), "itl_p50_s": pct(gaps, 50),
            "itl_p99_s": pct(gaps, 99), "errors": int((requests["status"] != 200).sum())}


def _agent_cmd(arm: str, ring: str, port: int, out_dir: Path, sink: OtlpSink | None) -> list[str]:
    cmd = [sys.executable, "-m", "infersight", "agent", "--ring", ring, "--listen", f"127.0.0.1:{port}",
           "--gpu-source", "auto" if arm == "full" else "none"]
    if arm in ("agent_recorder", "full"):
        # One directory per arm: each phase's fresh agent starts its budget from the window costs the arm's
        # earlier phases measured (as a restarted agent does), not from the guess (which takes no window
        # in a short phase). The first phase of the arm has only the guess.
        cmd += ["--flight-recorder", "--recorder-dir", str(out_dir / f"recorder-{arm}")]
    if arm == "full" and sink is not None:
        cmd += ["--otlp-endpoint", sink.url, "--parquet-dir", str(out_dir / "parquet")]
    return cmd


#: The agent's exposition names read here (exporters.catalogue's RECORDER_COST_RATIO and RECORDER_WINDOWS:
#: bench reads the agent from outside, as a client does, and imports no exporter).
RECORDER_COST_SAMPLE, RECORDER_WINDOWS_SAMPLE = "infersight_recorder_cost_ratio", "infersight_recorder_windows_total"


def _recorder_figures(url: str) -> tuple[float, float]:
    """The recorder's own amortised cost figure (infersight_recorder_cost_ratio) and the windows it
    measured (analysed) in this agent's life, from /metrics; NaN where the agent did not say."""
    cost, windows = float("nan"), float("nan")
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()  # noqa: S310 (loopback)
    except OSError:
        return cost, windows
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == RECORDER_COST_SAMPLE:
                cost = float(sample.value)
            elif sample.name == RECORDER_WINDOWS_SAMPLE and sample.labels.get("outcome") == "analysed":
                windows = float(sample.value)
    return cost, windows


def bench_serving(config: ServingBenchConfig, log: Any = print) -> dict[str, Any]:
    """Run every round and arm; returns the report (summarise) with the raw frames under "frames"."""
    out_dir = Path(tempfile.mkdtemp(prefix="infersight-bench-serving-"))
    ring = f"infersight-bench-serving-{_free_port()}"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    serve_log = open(out_dir / "serve.log", "w")
    serve = subprocess.Popen([sys.executable, "-m", "infersight", "serve", "--listen", f"127.0.0.1:{port}",
                              "--model", config.model, "--device", config.device, "--dtype", config.dtype,
                              "--ring", ring, "--seed", str(config.seed), *config.serve_args], stdout=serve_log, stderr=subprocess.STDOUT)
    sink = OtlpSink()
    tokens, requests, phases = [], [], []
    try:
        _wait_health(url, serve, "infersight serve", out_dir / "serve.log")
        run_phase(url, ServingBenchConfig(**{**config.__dict__, "phase_s": 2.0 + config.warmup_s}), seed=-1)
        for rnd in range(config.rounds):
            order = list(config.arms[rnd % len(config.arms):] + config.arms[:rnd % len(config.arms)])
            for arm in order:
                agent, agent_url = None, ""
                if arm.startswith(("agent", "full")):
                    aport = _free_port()
                    agent_url = f"http://127.0.0.1:{aport}"
                    with open(out_dir / f"agent_{rnd}_{arm}.log", "w") as agent_log:
                        agent = subprocess.Popen([*_agent_cmd(arm, ring, aport, out_dir, sink), *config.agent_args],
                                                 stdout=agent_log,
                                                 stderr=subprocess.STDOUT)
                    _wait_health(agent_url, agent, "infersight agent", out_dir / f"agent_{rnd}_{arm}.log")
                try:
                    engine_pid = next(iter(spawned_children(serve.pid)), None)  # serve's engine process, if split
                    cpu_before = _cpu_reading(serve.pid, engine_pid, agent.pid if agent is not None else None)
                    records, t0, t1 = run_phase(url, config, seed=config.seed * 1000 + rnd)
                    cpu = _cpu_cores(cpu_before, _cpu_reading(serve.pid, engine_pid,
                                                              agent.pid if agent is not None else None))
                    for who, pid in (("serve", serve.pid), ("engine", engine_pid),
                                     ("agent", agent.pid if agent is not None else None)):
                        cpu.update({f"{who}_{k}_mb": v for k, v in process_memory_mb(pid).items()})
                    cost, windows = _recorder_figures(agent_url) if agent is not None else (float("nan"),) * 2
                finally:
                    if agent is not None:
                        stop_agent(agent)
                tok = pd.DataFrame(records.tokens, columns=["request", "t_s"]).assign(arm=arm, round=rnd)
                req = pd.DataFrame(records.requests, columns=["request", "sent_s", "first_s", "done_s", "tokens",
                                                              "status"]).assign(arm=arm, round=rnd)
                figures = phase_figures(tok, req, t0, t1)
                phases.append({"arm": arm, "round": rnd, "t0_s": t0, "t1_s": t1, **figures,
                               "recorder_cost_ratio": cost, "recorder_windows": windows, **cpu})
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


FIGURES = ("tokens_per_s", "requests_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")
#: The interval on a median ratio covers it with at least this confidence (median_interval), and a run
#: resolves RESOLVE when that interval is no wider than 2 x RESOLVE (the issue's 0.5%: a cost that small
#: must show as different from 0, and a cost of 0 as smaller than it).
CONFIDENCE = 0.90
RESOLVE = 0.005


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, high, coverage): the distribution-free interval on the median of independent rounds, from
    their order statistics: the k-th smallest to the k-th largest, k the largest for which the chance
    that the median lies outside is at most 1 - confidence (binomial, p = 1/2). NaN below the rounds
    that can give it (5 for 90%: [min, max] then covers with 1 - 2/32 = 0.9375)."""
    x = np.sort(np.asarray([v for v in values if v == v], np.float64))
    n = len(x)
    best = None
    for k in range(1, n // 2 + 1):
        below = sum(math.comb(n, i) for i in range(k)) / 2 ** n  # P(fewer than k rounds below the median)
        coverage = 1 - 2 * below
        if coverage >= confidence:
            best = (float(x[k - 1]), float(x[n - k]), coverage)
    return best if best is not None else (math.nan, math.nan, math.nan)


def summarise(phases: pd.DataFrame, config: ServingBenchConfig) -> dict[str, Any]:
    """Per arm: each figure's median over rounds, and its ratio to the `none` phase of the same round
    (median over rounds); the A/A floor from `none_again`. phases: one row per (arm, round) with the
    FIGURES columns."""
    ref = phases[phases["arm"] == REFERENCE].set_index("round")
    arms: dict[str, Any] = {}
    for arm, g in phases.groupby("arm", sort=False):
        g = g.set_index("round")
        ratios = {f: g[f] / ref[f].reindex(g.index) for f in FIGURES}
        # The reference over itself is 1 by construction: no interval to give.
        low, high, coverage = (median_interval(ratios["tokens_per_s"].tolist()) if arm != REFERENCE
                               else (math.nan, math.nan, math.nan))
        arms[arm] = {"rounds": len(g),
                     # The median tokens/s ratio's distribution-free interval, and whether the run resolves
                     # RESOLVE with it (None: too few rounds to say).
                     "tokens_per_s_ratio_interval": [low, high], "interval_coverage": coverage,
                     "resolves": None if coverage != coverage else bool(high - low <= 2 * RESOLVE),
                     **{f: float(g[f].median()) for f in FIGURES},
                     **{f"{f}_ratio": float(r.median()) for f, r in ratios.items()},
                     "tokens_per_s_ratio_by_round": [round(float(x), 4) for x in ratios["tokens_per_s"]],
                     "recorder_cost_ratio": float(g["recorder_cost_ratio"].median()),
                     "recorder_windows_by_round": [float(x) for x in g.get("recorder_windows", pd.Series(dtype=float))],
                     **{f"{p}_cores": float(g[f"{p}_cores"].median()) if f"{p}_cores" in g else float("nan")
                        for p in ("serve", "engine", "agent", "client")},
                     **{f"{p}_{k}_mb_last": float(g[f"{p}_{k}_mb"].iloc[-1]) if f"{p}_{k}_mb" in g else float("nan")
                        for p in ("serve", "engine", "agent") for k in ("rss", "anon", "shmem")},
                     "errors": int(g["errors"].sum())}
    floor = {}
    if "none_again" in arms:
        by_round = np.asarray(arms["none_again"]["tokens_per_s_ratio_by_round"], np.float64)
        floor = {"tokens_per_s_aa_median": float(np.median(by_round)),
                 "tokens_per_s_aa_max_dev": float(np.max(np.abs(by_round - 1)))}
    return {"measured": True, "how": "client clock: streamed tokens (each chunk's usage.completion_tokens rise) and completions in each phase's window, "
            "each arm over the no-agent phase of its own round, median over rounds, with the median's "
            f"distribution-free interval from the rounds' order statistics (coverage >= {CONFIDENCE:.0%}; "
            f"'resolves': that interval is no wider than {2 * RESOLVE:.1%}); *_cores: CPU seconds "
            "(utime + stime from /proc) of serve (its engine process included; engine_cores: that process alone), the agent and "
            "the clients over each phase's wall time; *_rss_mb, *_anon_mb, "
            "*_shmem_mb: VmRSS, RssAnon and RssShmem (the probe ring's pages) at each phase's end",
            "config": {k: v for k, v in config.__dict__.items()}, "arms": arms, "aa_floor": floor,
            "phases": phases.to_dict("records")}


def print_report(report: dict[str, Any]) -> None:
    floor = report["aa_floor"]
    print(f"{'arm':<15} {'tok/s':>9} {'ratio':>7} {'req/s':>7} {'ratio':>7} {'TTFT p50':>9} {'p99':>8} "
          f"{'ITL p50':>8} {'p99':>8} {'recorder':>9}  cores: serve agent clients")
    for arm, a in report["arms"].items():
        print(f"{arm:<15} {a['tokens_per_s']:>9.1f} {a['tokens_per_s_ratio']:>7.4f} {a['requests_per_s']:>7.2f} "
              f"{a['requests_per_s_ratio']:>7.4f} {a['ttft_p50_s'] * 1e3:>8.1f}ms {a['ttft_p99_s'] * 1e3:>6.0f}ms "
              f"{a['itl_p50_s'] * 1e3:>6.1f}ms {a['itl_p99_s'] * 1e3:>6.1f}ms {a['recorder_cost_ratio']:>9.4f}"
              f"  {a['serve_cores']:5.2f} {a['agent_cores']:5.2f} {a['client_cores']:5.2f}")
    for arm, a in report["arms"].items():
        if arm == REFERENCE:
            continue
        low, high = a["tokens_per_s_ratio_interval"]
        verdict = ("too few rounds for an interval" if a["resolves"] is None else
                   f"{a['interval_coverage']:.1%} interval {low:.4f}-{high:.4f}: "
                   + ("resolves" if a["resolves"] else "does not resolve") + f" {RESOLVE:.1%}")
        windows = [w for w in a.get("recorder_windows_by_round", []) if w == w]
        taken = f"; recorder windows measured by round {', '.join(f'{w:.0f}' for w in windows)}" if windows else ""
        print(f"{arm:<15} tokens/s ratio {a['tokens_per_s_ratio']:.4f}, {verdict}{taken}")
    if floor:
        print(f"A/A floor (none_again / none, tokens/s): median {floor['tokens_per_s_aa_median']:.4f}, "
              f"largest deviation {floor['tokens_per_s_aa_max_dev']:.4f}")
    print("measured: " + report["how"])
