"""vLLM's worker traces: which file in the profiler directory is ours, vLLM's step ranges given the
ranges our kernel analysis reads, and the trace's analysis (sources.vllm.profiler drives the
profiler endpoints that write them; agent.recorder.vllm_windows reads flight-recorder windows with them).

The worker traces are the `*.pt.trace.json[.gz]` files in vLLM's torch_profiler_dir, not the API
server's `*async_llm*` one; of several new ones, ours by prefix when vLLM names it so, rank 0 first.

vLLM's worker wraps each profiled step in a record_function range named
`execute_context_<C>(<T>)_generation_<G>(<U>)` (C context requests with T tokens, G generation
requests with U tokens). The analysis keeps those ranges and adds, around each, the ranges our
report reads phases from: `step` > `forward.<phase>` with phase prefill (C > 0, G = 0), decode
(C = 0, G > 0), mixed (both) or empty (neither).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from infersight.kernels.analysis.cpu_trace import cpu_report, has_device_activity, parse_cpu_ops
from infersight.kernels.readers.kineto import parse_kineto, read_json_document
from infersight.kernels.analysis.report import build_report

TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json")
_STEP_RANGE = re.compile(r"^execute_(?:\d+_)?context_(\d+)\(.*\)_generation_(\d+)\(.*\)$")
_RANK = re.compile(r"rank(\d+)")


def step_phase(name: str) -> str | None:
    """The phase of one of vLLM's step ranges (see the module docstring); None for other names."""
    m = _STEP_RANGE.match(name)
    if m is None:
        return None
    context, generation = int(m.group(1)), int(m.group(2))
    return {(True, False): "prefill", (False, True): "decode", (True, True): "mixed"}.get(
        (context > 0, generation > 0), "empty")


def with_step_ranges(doc: Any) -> tuple[Any, int]:
    """(a copy of the Kineto document with `step` and `forward.<phase>` ranges around each of vLLM's
    step ranges, the number of step ranges). The input is not modified."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        return doc, 0
    out, steps = [], 0
    for e in events:
        phase = step_phase(str(e.get("name", ""))) if isinstance(e, dict) and e.get("cat") == "user_annotation" \
            and e.get("ph") == "X" else None
        if phase is not None:
            steps += 1
            base = {k: e[k] for k in ("ph", "cat", "pid", "tid", "ts", "dur") if k in e}
            out += [{**base, "name": "step"}, {**base, "name": f"forward.{phase}"}]  # same span, outermost first
        out.append(e)
    return ({**doc, "traceEvents": out} if isinstance(doc, dict) else out), steps


def analyze_vllm_trace(path: str) -> dict[str, Any]:
    """The report of one vLLM worker trace (TraceError when it cannot be read), plus `steps`: how
    many of vLLM's step ranges it holds."""
    doc, steps = with_step_ranges(read_json_document(path))
    if has_device_activity(doc):
        report = build_report(parse_kineto(doc, path))
    else:
        report = cpu_report(parse_cpu_ops(doc, path))
    report["steps"] = steps
    return report


def trace_files(directory: Path) -> dict[str, int]:
    """Worker trace files in `directory` (not the API server's async_llm ones): name -> size."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return {}
    return {e.name: e.stat().st_size for e in entries
            if e.is_file() and e.name.endswith(TRACE_SUFFIXES) and "async_llm" not in e.name}


def pick_worker_trace(names: list[str], prefix: str) -> str | None:
    """Of new worker trace names, ours by prefix when any is, and rank 0 (the lowest rank) first."""
    ours = [n for n in names if n.startswith(prefix + "_")] or names

    def rank(name: str) -> tuple[int, str]:
        m = _RANK.search(name)
        return (int(m.group(1)) if m else 1 << 30, name)

    return min(ours, key=rank) if ours else None


def complete_trace(path: str) -> dict[str, Any]:
    """{} once the trace parses (TraceError before: torch may still be writing it)."""
    read_json_document(path)
    return {}
