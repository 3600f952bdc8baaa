"""A seeded, task-labelled workload: prompts per task behind shared system prompts, Poisson
arrivals with bursts, and a long tail of prompt lengths (which is what forces preemption).

Everything is built offline from what any Python installation has: its standard-library sources
(task `code`), a seeded JSON record generator (`json`), standard-library docstrings (`chat`) and
high-entropy text (`creative`).
"""
from __future__ import annotations

import ast
import json
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

TASKS = ("code", "json", "chat", "creative")

SYSTEM_PROMPTS = {
    "code": "You are a Python expert. Complete the code.\n",
    "json": "You emit one JSON object per line, valid and compact.\n",
    "chat": "You are a helpful assistant. Answer in plain English.\n",
    "creative": "You are a poet. Surprise the reader.\n",
}

_STDLIB_FILES = ("json/decoder.py", "textwrap.py", "heapq.py", "bisect.py", "fractions.py", "statistics.py",
                 "string.py", "shlex.py", "calendar.py", "colorsys.py")


@dataclass(frozen=True)
class WorkloadRequest:
    arrival_s: float
    task: str
    prompt: str
    max_tokens: int


@dataclass
class WorkloadConfig:
    num_requests: int = 96
    rate_per_s: float = 8.0          # mean Poisson arrival rate
    burst_probability: float = 0.1   # chance that an arrival brings a burst
    burst_size: int = 6
    max_tokens: int = 48
    long_tail_alpha: float = 1.3     # Pareto shape of the prompt-length multiplier
    max_prompt_chars: int = 700
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.rate_per_s <= 0 or self.max_tokens < 1:
            raise ValueError("num_requests, rate_per_s and max_tokens must be positive")


def _stdlib_texts() -> tuple[list[str], list[str]]:
    """(code snippets, docstrings) from a fixed list of standard-library modules."""
    root = Path(sysconfig.get_paths()["stdlib"])
    code, prose = [], []
    for rel in _STDLIB_FILES:
        path = root / rel
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                segment = ast.get_source_segment(source, node)
                if segment:
                    code.append(segment)
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    prose.append(" ".join(doc.split()))
    return code or ["def add(a, b):\n    return a + b\n"], prose or ["Return the sum of two numbers."]


def _json_record(rng: random.Random) -> str:
    record = {"id": rng.randrange(10**6), "name": rng.choice(["ada", "bob", "cy", "dee", "eve"]),
              "score": round(rng.random() * 100, 2), "tags": rng.sample(["a", "b", "c", "d", "e", "f"], 3),
              "active": rng.random() < 0.5}
    return json.dumps(record, separators=(",", ":"))


def _creative(rng: random.Random, n: int) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz ,.;!?ÆØÅ0123456789"
    return "".join(rng.choice(alphabet) for _ in range(n))


def build_workload(config: WorkloadConfig) -> list[WorkloadRequest]:
    rng = random.Random(config.seed)
    code, prose = _stdlib_texts()
    out: list[WorkloadRequest] = []
    t = 0.0
    while len(out) < config.num_requests:
        t += rng.expovariate(config.rate_per_s)
        n_here = config.burst_size if rng.random() < config.burst_probability else 1
        for _ in range(min(n_here, config.num_requests - len(out))):
            task = rng.choice(TASKS)
            # Long tail: most prompts short, a few many times longer.
            length = min(config.max_prompt_chars, int(60 * rng.paretovariate(config.long_tail_alpha)))
            if task == "code":
                body = rng.choice(code)
            elif task == "json":
                body = "\n".join(_json_record(rng) for _ in range(1 + length // 60))
            elif task == "chat":
                body = rng.choice(prose)
            else:
                body = _creative(rng, length)
            out.append(WorkloadRequest(round(t, 6), task, SYSTEM_PROMPTS[task] + body[:length], config.max_tokens))
    return out
