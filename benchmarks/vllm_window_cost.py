"""What one flight-recorder window costs a real vLLM, through its profiler endpoints (CPU build here).

One vLLM (tiny random Llama, `--profiler-config` torch without stacks) serves one streamed request
of --tokens tokens; the client stamps every token. --windows times, spaced --gap-tokens apart, it asks
for a window the way the recorder would: POST /start_profile {"max_iterations": N}, then, N + 2
tokens later, /stop_profile, and waits for the worker's trace file. A window's cost is the extra time in the
token stream from the start call to --after tokens past the trace's appearance, against the median
inter-token gap of the stream's first stretch (before any window); the noise floor is 1.4826 x MAD
of those gaps x sqrt(gaps charged). Also printed: how long each endpoint call took and the trace size.

    python benchmarks/vllm_window_cost.py --windows 3 --steps 4

Prints `key: value` lines, then one JSON object as the last line. Needs `make vllm-env`.
"""
from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from infersight.sources.vllm.profiler import trace_files
from infersight.vllm.launch import VllmServer, VllmServerConfig, build_tiny_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict | None) -> float:
    """POST, and the seconds it took."""
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    t = time.monotonic()
    with urllib.request.urlopen(req, timeout=300):  # noqa: S310 (our own server)
        pass
    return time.monotonic() - t


def stream(url: str, tokens: int, stamps: list[float]) -> None:
    body = json.dumps({"model": "tiny-llama", "prompt": "the cache block token " * 4, "max_tokens": tokens,
                       "temperature": 0.0, "ignore_eos": True, "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:  # noqa: S310
        for line in resp:
            if line.startswith(b"data: {"):
                stamps.append(time.monotonic())


def profiled_tiny_server(prefix: str, **profiler_options: object) -> tuple[Path, Path, VllmServerConfig]:
    """(a new temporary directory, its profiles/ directory, the config of a tiny-Llama vLLM profiling
    into it); SIGTERM unwinds, so that the server is stopped on the way out."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    root = Path(tempfile.mkdtemp(prefix=prefix))
    prof = root / "profiles"
    prof.mkdir()
    model = build_tiny_model(root / "tiny-llama", "llama")
    return root, prof, VllmServerConfig(model=str(model), port=free_port(), profiler_dir=str(prof),
                                        profiler_options=dict(profiler_options), served_model_name="tiny-llama",
                                        max_model_len=2048, kv_cache_memory_bytes=32 << 20, cwd=str(root))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--steps", type=int, default=4, help="max_iterations of each window")
    p.add_argument("--tokens", type=int, default=900)
    p.add_argument("--gap-tokens", type=int, default=200, help="tokens between windows (and before the first)")
    p.add_argument("--after", type=int, default=3, help="tokens after the trace appeared, still charged")
    args = p.parse_args()
    root, prof, config = profiled_tiny_server("infersight-vllm-window-")
    results = []
    with VllmServer(config, log_path=root / "vllm.log") as server:
        stamps: list[float] = []
        client = threading.Thread(target=stream, args=(server.url, args.tokens, stamps), daemon=True)
        client.start()
        for k in range(args.windows):
            while len(stamps) < args.gap_tokens * (k + 1):
                time.sleep(0.01)
            before = set(trace_files(prof))
            started = time.monotonic()
            start_s = post(server.url + "/start_profile", {"profile_prefix": f"window-{k}", "max_iterations": args.steps})
            at = len(stamps)
            while len(stamps) < at + args.steps + 2 and client.is_alive():  # the window's steps, two to spare
                time.sleep(0.005)
            stop_s = post(server.url + "/stop_profile", None)  # vLLM writes the trace now (if not yet)
            while not (set(trace_files(prof)) - before) and time.monotonic() - started < 120:
                time.sleep(0.01)
            appeared = time.monotonic()
            new = sorted(set(trace_files(prof)) - before)
            results.append({"started": started, "appeared": appeared, "start_call_s": start_s, "stop_call_s": stop_s,
                            "window_s": appeared - started,
                            "trace_bytes": sum(trace_files(prof)[n] for n in new)})
        client.join(timeout=600)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    base_gaps = gaps[10:args.gap_tokens - 5]  # past the first tokens, before the first window
    base = statistics.median(base_gaps)
    mad = statistics.median([abs(g - base) for g in base_gaps])
    for r in results:
        first = next(i for i, t in enumerate(stamps) if t >= r["started"])
        last = min(next((i for i, t in enumerate(stamps) if t >= r["appeared"]), len(stamps) - 1) + args.after,
                   len(stamps) - 1)
        span, n = stamps[last] - stamps[first - 1], last - first + 1
        r.update(tokens_charged=n, cost_s=span - n * base, noise_s=1.4826 * mad * n ** 0.5)
    out = {"steps": args.steps, "base_itl_s": base, "base_itl_mad_s": mad, "tokens": len(stamps),
           "windows": [{k: v for k, v in r.items() if k not in ("started", "appeared")} for r in results],
           "cost_median_s": statistics.median(r["cost_s"] for r in results),
           "cost_in_steps": statistics.median(r["cost_s"] for r in results) / base}
    report(out, ("base_itl_s", "cost_median_s", "cost_in_steps"),
           [f"cost {w['cost_s']:.3f} s (noise {w['noise_s']:.3f}), start call {w['start_call_s']:.3f} s, trace after "
            f"{w['window_s']:.3f} s, stop call {w['stop_call_s']:.3f} s, {w['trace_bytes']} bytes" for w in out["windows"]])
    return 0


def report(out: dict, keys: tuple[str, ...], windows: list[str]) -> None:
    """`key: value` lines, one line per window, then the JSON object as the last line."""
    for k in keys:
        print(f"{k}: {out[k]}")
    for i, line in enumerate(windows):
        print(f"window {i}: {line}")
    print(json.dumps(out))


if __name__ == "__main__":
    raise SystemExit(main())
