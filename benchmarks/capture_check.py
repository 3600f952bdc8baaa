"""On-demand capture on a GPU, through the agent's API, and what it costs the engine afterwards.

Two identical runs of `llama-1b-shape` (bf16, steady decode, probes on, an in-process agent):
run A never captures; run B asks POST /api/v1/capture for 20 steps at the same point. Decode
steps after the capture window are timed in both at the same step indices (so context length,
and with it attention cost, is the same), and the ratio B/A of their medians is printed (the
goal is <= 1.01: outside a capture window the engine pays nothing). The capture trace goes to
$OUT for offline analysis (`infersight analyze`), and its kernel breakdown is printed.

    python benchmarks/capture_check.py [--model llama-1b-shape] [--batch 32] [--steps 60]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import urllib.request

import torch

from infersight.agent.config import AgentConfig
from infersight.agent.service import Agent
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig, SamplingParams


def timed_steps(engine: Engine, n: int) -> list[float]:
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def run(args: argparse.Namespace, capture: bool) -> tuple[list[float], list[float], object]:
    """(window step times, after-window step times, capture record or None)."""
    tmp = tempfile.mkdtemp()
    name = f"infersight-capcheck-{os.getpid()}-{int(capture)}"
    probe = ProbeObserver(ProbeConfig(ring_name=name, capture_dir=tmp))
    engine = Engine(EngineConfig(model=args.model, device="cuda", dtype="bfloat16", max_num_seqs=args.batch,
                                 max_num_batched_tokens=args.batch * 128), probe)
    agent = Agent(AgentConfig(rings=[name], port=0, token="check", gpu_source="none"))
    agent.start_http()
    for i in range(args.batch):
        engine.add_request([(7 * i + j) % 256 for j in range(128)],
                           SamplingParams(temperature=0, max_tokens=args.steps + 60, ignore_eos=True))
    engine.step()
    timed_steps(engine, 10)  # warm-up
    agent.poll_once()
    record = None
    if capture:
        req = urllib.request.Request(f"http://127.0.0.1:{agent.port}/api/v1/capture", method="POST",
                                     data=json.dumps({"steps": 20, "tool": args.tool}).encode(),
                                     headers={"Authorization": "Bearer check"})
        urllib.request.urlopen(req).read()
    window = timed_steps(engine, 21)  # the capture window (20 steps) and the step that writes nothing
    agent.poll_once()
    after = timed_steps(engine, args.steps)
    agent.poll_once()
    if capture:
        record = agent.captures.records[-1]
    agent.close()
    probe.close()
    del engine
    torch.cuda.empty_cache()
    return window, after, record


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b-shape")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--tool", default="torch", choices=["torch", "cuda-profiler"])
    args = ap.parse_args()
    win_a, after_a, _ = run(args, capture=False)
    win_b, after_b, record = run(args, capture=True)
    a, b = statistics.median(after_a), statistics.median(after_b)
    print(f"capture: state={record.state} path={record.path}")
    print(f"median decode step in the window: no capture {statistics.median(win_a) * 1e3:.3f} ms, "
          f"capturing {statistics.median(win_b) * 1e3:.3f} ms")
    print(f"median decode step after the window: no capture {a * 1e3:.3f} ms, after a capture {b * 1e3:.3f} ms, "
          f"ratio {b / a:.4f}")
    out = os.environ.get("OUT")
    if out and record.path and record.path.endswith(".gz"):
        shutil.copy(record.path, os.path.join(out, f"capture_{args.model}.json.gz"))
    if record.analysis:
        print(json.dumps({k: record.analysis.get(k) for k in ("source", "kernels", "categories", "findings")},
                         indent=1)[:4000])


if __name__ == "__main__":
    main()
