"""On-demand capture on a GPU, through the agent's API, and what it costs the engine.

Runs `llama-1b-shape` (bf16) in steady decode with probes on and an in-process agent; times
decode steps before any capture, asks POST /api/v1/capture for 20 steps, lets the capture run
and be written, then times decode steps again. Prints the median step times and their ratio
(after / before; the goal is <= 1.01: outside a capture window the engine pays nothing), and
copies the capture trace to $OUT for offline analysis (`infersight analyze`).

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b-shape")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    name = f"infersight-capcheck-{os.getpid()}"
    probe = ProbeObserver(ProbeConfig(ring_name=name, capture_dir=tmp))
    engine = Engine(EngineConfig(model=args.model, device="cuda", dtype="bfloat16", max_num_seqs=args.batch,
                                 max_num_batched_tokens=args.batch * 128), probe)
    agent = Agent(AgentConfig(rings=[name], port=0, token="check", gpu_source="none"))
    agent.start_http()
    for i in range(args.batch):
        engine.add_request([(7 * i + j) % 256 for j in range(128)],
                           SamplingParams(temperature=0, max_tokens=3 * args.steps + 60, ignore_eos=True))
    engine.step()
    timed_steps(engine, 5)  # warm-up
    agent.poll_once()
    before = timed_steps(engine, args.steps)
    req = urllib.request.Request(f"http://127.0.0.1:{agent.port}/api/v1/capture", method="POST",
                                 data=json.dumps({"steps": 20}).encode(),
                                 headers={"Authorization": "Bearer check"})
    print("capture request:", json.loads(urllib.request.urlopen(req).read())["state"])
    during = timed_steps(engine, 25)
    agent.poll_once()
    record = agent.captures.records[-1]
    after = timed_steps(engine, args.steps)
    agent.poll_once()
    b, a = statistics.median(before), statistics.median(after)
    print(f"capture: state={record.state} path={record.path}")
    print(f"median decode step: before {b * 1e3:.3f} ms, during-capture window {statistics.median(during) * 1e3:.3f} ms, "
          f"after {a * 1e3:.3f} ms, after/before {a / b:.4f}")
    out = os.environ.get("OUT")
    if out and record.path:
        shutil.copy(record.path, os.path.join(out, f"capture_{args.model}.json.gz"))
    if record.analysis:
        print(json.dumps({k: record.analysis.get(k) for k in ("source", "kernels", "categories")}, indent=1)[:3000])
    agent.close()
    probe.close()


if __name__ == "__main__":
    main()
