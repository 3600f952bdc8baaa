"""Replay a task-labelled workload (infersight.workload) against an OpenAI-compatible server over
HTTP, streaming, as a user's client would; each result carries the client's own clock readings."""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from infersight.workload import WorkloadRequest


@dataclass(frozen=True)
class ClientResult:
    task: str
    request_id: str
    status: int
    sent_s: float         # client monotonic seconds
    first_byte_s: float
    done_s: float
    error: str = ""

    @property
    def e2e_s(self) -> float:
        return self.done_s - self.sent_s


def send_completion(base_url: str, model: str, prompt: str, max_tokens: int, task: str | None = None,
                    headers: dict[str, str] | None = None, timeout_s: float = 120) -> ClientResult:
    """One streamed /v1/completions request; the response id comes from the first SSE chunk."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "ignore_eos": True, "stream": True}).encode()
    hdrs = {"content-type": "application/json", **(headers or {})}
    if task:
        hdrs["x-infersight-task"] = task
    req = urllib.request.Request(base_url + "/v1/completions", data=body, headers=hdrs, method="POST")
    sent = time.monotonic()
    first = 0.0
    rid = ""
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (the caller's server)
            for line in resp:
                if not first:
                    first = time.monotonic()
                if not rid and line.startswith(b"data: {"):
                    rid = json.loads(line[6:]).get("id", "")
            status = resp.status
    except (OSError, ValueError) as exc:
        now = time.monotonic()
        return ClientResult(task or "", rid, getattr(exc, "code", 0) or 0, sent, first or now, now, str(exc))
    return ClientResult(task or "", rid, status, sent, first, time.monotonic())


def replay(base_url: str, model: str, workload: list[WorkloadRequest], concurrency: int = 16,
           on_done: Callable[[ClientResult], None] | None = None) -> list[ClientResult]:
    """Send each request at its arrival time (threads, at most ``concurrency`` in flight)."""
    results: list[ClientResult] = []
    lock = threading.Lock()
    start = time.monotonic()

    def one(r: WorkloadRequest) -> None:
        delay = r.arrival_s - (time.monotonic() - start)
        if delay > 0:
            time.sleep(delay)
        res = send_completion(base_url, model, r.prompt, r.max_tokens, r.task)
        with lock:
            results.append(res)
        if on_done is not None:
            on_done(res)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, workload))
    return results
