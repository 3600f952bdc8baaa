"""`infersight demo`: run the reference engine on a small mixed workload and show, per request,
where its time went (queue, prefill, decode) with prefix-cache and speculation results."""
from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from infersight.runtime import LLM, RequestOutput, SamplingParams

SYSTEM_PROMPT = "You are a careful assistant. Answer briefly and precisely.\n"

DEMO_PROMPTS: list[tuple[str, str]] = [
    ("code", "def fibonacci(n):\n    "),
    ("code", "import json\n\ndef load(path):\n    "),
    ("json", '{"id": 17, "name": "'),
    ("json", '{"items": [1, 2, 3], "total": '),
    ("chat", "Explain what a KV cache is."),
    ("chat", "Why is decoding memory-bound?"),
    ("creative", "Write a short poem about the sea."),
    ("creative", "Invent a name for a new colour."),
]


@dataclass
class DemoConfig:
    model: str = "tiny-moe"
    draft: str | None = "tiny-draft"
    device: str = "cpu"
    max_tokens: int = 48
    seed: int = 0


def ms(a: int | None, b: int | None) -> float:
    return (b - a) / 1e6 if a is not None and b is not None else float("nan")


def run_demo(config: DemoConfig) -> list[tuple[str, RequestOutput]]:
    llm = LLM(config.model, device=config.device, seed=config.seed, speculative_model=config.draft)
    prompts = [SYSTEM_PROMPT + p for _, p in DEMO_PROMPTS]
    params = [SamplingParams(temperature=0.0, max_tokens=config.max_tokens, task=task, ignore_eos=True)
              for task, _ in DEMO_PROMPTS]
    outputs = llm.generate(prompts, params)
    return [(task, out) for (task, _), out in zip(DEMO_PROMPTS, outputs)]


def print_demo(results: list[tuple[str, RequestOutput]], console: Console) -> None:
    table = Table(title="infersight demo: per-request timings (ms)")
    for col in ("id", "task", "prompt", "cached", "out", "queue", "prefill", "TTFT", "decode", "e2e",
                "spec acc", "preempt"):
        table.add_column(col, justify="right")
    for task, o in results:
        t = o.times
        prefill_end = t.prefill_chunks[-1][1] if t.prefill_chunks else None
        acc = f"{o.num_spec_accepted}/{o.num_spec_proposed}" if o.num_spec_proposed else "-"
        table.add_row(str(o.request_id), task, str(len(o.prompt_token_ids)), str(o.num_cached_tokens),
                      str(len(o.token_ids)), f"{ms(t.arrival_ns, t.first_scheduled_ns):.1f}",
                      f"{ms(t.first_scheduled_ns, prefill_end):.1f}", f"{ms(t.arrival_ns, t.first_token_ns):.1f}",
                      f"{ms(t.first_token_ns, t.finish_ns):.1f}", f"{ms(t.arrival_ns, t.finish_ns):.1f}",
                      acc, str(o.num_preemptions))
    console.print(table)
