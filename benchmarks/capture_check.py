"""On-demand capture on a GPU through the agent's API: what it finds, and what it costs afterwards.

One engine in one process (so both conditions share weights, memory, host and clocks) runs the
same round again and again: `--batch` fresh prompts of `--prompt` random tokens, each decoding
`--tokens` tokens, greedy. Decode step i of every round has the same shapes, so rounds compare
step for step. After a warm-up round come `--before` rounds, one round in which the agent is
asked (POST /api/v1/capture) for `--capture-steps` steps starting at decode step `--capture-at`,
then `--after` rounds. The agent runs as its own process, as a sidecar does in production: its
ingest and its analysis of the trace must not be billed to the engine. Printed: each round's median decode step, the after/before ratio of the
pooled medians (goal <= 1.01), the spread among the before rounds (the noise floor), the cost
inside the window, and the agent's own analysis of the capture, roofline included (modelled from
the capture's shapes file). With --tool cuda-profiler the window is cudaProfilerStart/Stop (run
under `ncu --profile-from-start off` or `nsys --capture-range=cudaProfilerApi` to record it).

    python benchmarks/capture_check.py [--model llama-1b-shape] [--batch 32] [--tool torch]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import tempfile
import time
import urllib.request

import torch

import socket
import subprocess
import sys

from infersight.agent.capture.controller import default_token_file
from infersight.kernels.analysis.report import ceilings_lines
from infersight.kernels.analysis.roofline import steps_work
from infersight.kernels.readers.shapes import load_capture_shapes, shapes_path_for
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig, SamplingParams


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_round(engine: Engine, args: argparse.Namespace, seed: int, capture=None) -> list[float]:
    """Decode step times of one round (seconds, by decode step index). capture(): called just
    before decode step args.capture_at."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(args.batch):
        engine.add_request(torch.randint(0, 256, (args.prompt,), generator=gen).tolist(),
                           SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True))
    times, decode_index = [], 0
    while engine.has_unfinished():
        if capture is not None and decode_index == args.capture_at:
            capture()
            capture = None
        sync()
        t0 = time.perf_counter()
        stats = engine.step()
        sync()
        dt = time.perf_counter() - t0
        if stats.phase == "decode" and stats.num_decode_tokens == args.batch:
            times.append(dt)
            decode_index += 1
    for rid in list(engine.requests):
        engine.release(rid)
    return times


def replay_under_profiler(graphs) -> None:  # noqa: ANN001 -- runtime.runner.cuda_graphs.DecodeGraphs
    """Let `graphs.run` replay while torch.profiler records: it falls back to eager when it sees the
    profiler's flag, so the flag is hidden for the call alone (the ranges outside it still see it)."""
    import torch.autograd.profiler as autograd_profiler

    run = graphs.run

    def replaying(items, expert_counts=None, graphs_while_profiling=False):  # noqa: ANN001, ANN202
        enabled = autograd_profiler._is_profiler_enabled
        autograd_profiler._is_profiler_enabled = False
        try:
            return run(items, expert_counts, graphs_while_profiling)
        finally:
            autograd_profiler._is_profiler_enabled = enabled

    graphs.run = replaying


def profiler_gemm_flops(trace_path: str) -> float:
    """2*M*K*N of every weight matrix multiply (aten::mm / addmm) the profiler recorded, from
    record_shapes' "Input Dims": an independent count against the roofline's modelled GEMM FLOPs.
    (Batched bmm is left out: in this runtime only the torch decode attention's einsums use it.)"""
    with gzip.open(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    total = 0.0
    for e in events:
        dims = e.get("args", {}).get("Input Dims")
        if e.get("cat") != "cpu_op" or not dims:
            continue
        if e["name"] == "aten::mm":
            (m, k), (_, n) = dims[0], dims[1]
            total += 2.0 * m * k * n
        elif e["name"] == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
            total += 2.0 * m * k * n
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b-shape")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--before", type=int, default=3)
    ap.add_argument("--after", type=int, default=3)
    ap.add_argument("--capture-at", type=int, default=10)
    ap.add_argument("--capture-steps", type=int, default=20)
    ap.add_argument("--tool", default="torch", choices=["torch", "cuda-profiler", "torch-kernels"])
    ap.add_argument("--decode-attention", default="auto", choices=["auto", "torch", "triton"])
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    ap.add_argument("--replay-graphs", action="store_true",
                    help="replay CUDA graphs inside the capture too (the engine runs decode eagerly while "
                         "torch.profiler records, for per-layer ranges): what a capture of the fast engine sees")
    ap.add_argument("--agent-nice", type=int, default=0,
                    help="run the agent under `nice -n N` with one thread per math library")
    args = ap.parse_args()
    out = os.environ.get("OUT") or tempfile.mkdtemp()
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    name = f"infersight-capcheck-{os.getpid()}"
    probe = ProbeObserver(ProbeConfig(ring_name=name, capture_dir=tmp))
    blocks = args.batch * -(-(args.prompt + args.tokens + 1) // 16) + 64
    engine = Engine(EngineConfig(model=args.model, device=args.device, dtype="bfloat16", max_num_seqs=args.batch,
                                 max_num_batched_tokens=args.batch * args.prompt, num_kv_blocks=blocks,
                                 enable_prefix_caching=False, decode_attention=args.decode_attention), probe)
    if args.replay_graphs and engine.target.graphs is not None:
        replay_under_profiler(engine.target.graphs)
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    prefix = ["nice", "-n", str(args.agent_nice)] if args.agent_nice else []
    threads = {k: "1" for k in ("OMP_NUM_THREADS", "NUMEXPR_MAX_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    agent = subprocess.Popen(prefix + [sys.executable, "-m", "infersight", "agent", "--ring", name,
                                       "--listen", f"127.0.0.1:{port}", "--poll-interval", "0.2"],
                             env={**os.environ, **(threads if args.agent_nice else {})})
    base = f"http://127.0.0.1:{port}/api/v1"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            break
        except OSError:
            time.sleep(0.1)
    token = default_token_file(port).read_text().strip()

    def ask() -> None:
        req = urllib.request.Request(f"{base}/capture", method="POST",
                                     data=json.dumps({"steps": args.capture_steps, "tool": args.tool}).encode(),
                                     headers={"Authorization": f"Bearer {token}"})
        urllib.request.urlopen(req).read()

    def finished_capture() -> dict:
        for _ in range(1200):
            records = json.loads(urllib.request.urlopen(f"{base}/captures").read())["captures"]
            if records and records[-1]["state"] in ("done", "failed") and (
                    records[-1]["analysis"] is not None or records[-1]["state"] == "failed"):
                return records[-1]
            time.sleep(0.1)
        raise SystemExit("the agent did not report the capture within 120 s")

    print(f"model {args.model}, batch {args.batch}, prompt {args.prompt}, {args.tokens} tokens, "
          f"decode kernel {engine.decode_attention}, tool {args.tool}, "
          f"CUDA graphs {'on' if engine.target.graphs is not None else 'off: ' + str(engine.target.graph_blocker)}"
          f"{', replayed inside the capture' if args.replay_graphs else ', eager inside the capture'}")
    run_round(engine, args, seed=0)  # warm-up: allocator, Triton JIT, cuBLAS heuristics
    rounds = []
    for r in range(args.before + 1 + args.after):
        label = "before" if r < args.before else ("capture" if r == args.before else "after")
        times = run_round(engine, args, seed=r + 1, capture=ask if label == "capture" else None)
        rounds.append((label, times))
        print(f"round {r} ({label}): {len(times)} decode steps, median {statistics.median(times) * 1e3:.3f} ms")
    before = [t for label, ts in rounds if label == "before" for t in ts]
    after = [t for label, ts in rounds if label == "after" for t in ts]
    medians = [statistics.median(ts) for label, ts in rounds if label == "before"]
    cap = next(ts for label, ts in rounds if label == "capture")
    window = cap[args.capture_at:args.capture_at + args.capture_steps]
    outside = cap[:args.capture_at]
    ratio = statistics.median(after) / statistics.median(before) if before and after else None
    if ratio is not None:
        print(f"median decode step: before {statistics.median(before) * 1e3:.3f} ms, "
              f"after {statistics.median(after) * 1e3:.3f} ms, ratio after/before {ratio:.4f}")
    if medians:
        print(f"noise floor: before rounds' medians span {min(medians) * 1e3:.3f}-{max(medians) * 1e3:.3f} ms "
              f"({max(medians) / min(medians):.4f})")
    print(f"inside the window: median {statistics.median(window) * 1e3:.3f} ms vs {statistics.median(outside) * 1e3:.3f} ms "
          f"before it in the same round ({statistics.median(window) / statistics.median(outside):.2f}x)")
    record = finished_capture()
    print(f"capture: state={record['state']} path={record['path']}")
    summary = {"model": args.model, "batch": args.batch, "prompt": args.prompt, "tokens": args.tokens, "tool": args.tool,
               "decode_attention": engine.decode_attention, "rounds": [[label, ts] for label, ts in rounds],
               "ratio_after_before": ratio, "before_round_medians": medians}
    analysis, path = record["analysis"] or {}, record["path"]
    tag = "-replay" if args.replay_graphs else ""
    if path.endswith(".gz"):
        shutil.copy(path, os.path.join(out, f"capture_{args.model}{tag}.json.gz"))
    shapes = shapes_path_for(path) if path else None
    if shapes is not None and shapes.is_file():
        shutil.copy(shapes, os.path.join(out, f"capture_{args.model}{tag}.shapes.json"))
    roof = [r for r in analysis.get("roofline", []) if r["phase"] == "captured"]
    if roof:
        print("roofline of the captured steps (modelled from the shapes file):")
        print("\n".join(ceilings_lines(analysis["ceilings"])))  # the bound is against these (measured / datasheet)
        for r in roof:
            print(f"  {r['op_category']:<18} {r['flops'] / 1e12:9.3f} TFLOP {r['bytes'] / 1e9:9.3f} GB "
                  f"{r['kernel_ns'] / 1e6:9.2f} ms  {r['achieved_gbps']:8.0f} GB/s  {r['achieved_tflops']:7.1f} TFLOP/s  {r['bound']}")
    if path.endswith(".gz") and shapes is not None and shapes.is_file():
        captured = load_capture_shapes(shapes)
        work = steps_work(captured.model, captured.steps, captured.dtype_bytes).set_index("op_category")
        modelled, counted = float(work.loc["GEMM", "flops"]), profiler_gemm_flops(path)
        summary["gemm_flops_modelled"], summary["gemm_flops_profiler"] = modelled, counted
        print(f"GEMM FLOPs: modelled {modelled / 1e12:.4f} T, counted from the profiler's recorded shapes "
              f"{counted / 1e12:.4f} T, model error {modelled / counted - 1:+.2%}" if counted else
              "GEMM FLOPs: the profiler counted none")
    if analysis:
        print(json.dumps({k: analysis.get(k) for k in ("kernels", "categories", "findings", "note", "error")},
                         indent=1)[:5000])
    summary["analysis"] = analysis
    with open(os.path.join(out, f"capture_check_{args.tool}{tag}.json"), "w") as f:
        json.dump(summary, f, default=str)
    agent.terminate()
    agent.wait(timeout=30)
    probe.close()


if __name__ == "__main__":
    main()
