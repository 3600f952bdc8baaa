"""bench serving's closed-loop clients and what they measure, by their own clock.

Each client streams /v1/completions and sends its next request when the last one ends. A chunk's tokens are
the rise of its usage.completion_tokens (vLLM's continuous_usage_stats: the server merges the tokens of a
client it fell behind on) and share the chunk's arrival time.

Frames:
  tokens    request, t_s (client monotonic seconds of each streamed token; a chunk's tokens share its t_s)
  requests  request, sent_s, first_s, done_s, tokens, status
"""
from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from infersight.bench.serving.config import ServingBenchConfig


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


def output_lengths(config: ServingBenchConfig, n: int, seed: int) -> list[int]:
    """n requests' max_tokens: config.max_tokens each, or drawn uniformly from max_tokens x [1 - spread,
    1 + spread] (at least 1)."""
    if config.max_tokens_spread == 0:
        return [config.max_tokens] * n
    rng = random.Random(seed + 1)
    low = max(1, round(config.max_tokens * (1 - config.max_tokens_spread)))
    high = max(low, round(config.max_tokens * (1 + config.max_tokens_spread)))
    return [rng.randint(low, high) for _ in range(n)]


def run_phase(url: str, config: ServingBenchConfig, seed: int) -> tuple[PhaseRecords, float, float]:
    """Closed loop: each client sends its next request when the last one ends, until phase_s has
    passed; returns the records and the measured window (client monotonic seconds)."""
    records = PhaseRecords()
    start = time.monotonic()
    window = (start + config.warmup_s, start + config.phase_s)
    counter = iter(range(1 << 30))
    lock = threading.Lock()
    prompts = _prompts(config, 512, seed)
    lengths = output_lengths(config, 512, seed)

    def client() -> None:
        while time.monotonic() < window[1]:
            with lock:
                rid = next(counter)
            _stream_one(url, config.model, prompts[rid % len(prompts)], lengths[rid % len(lengths)], rid, records)

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
