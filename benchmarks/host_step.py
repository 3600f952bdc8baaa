"""Host time of one decode step of the engine, the GPU taken out: what Engine.step costs the CPU
around a CUDA-graph replay (schedule, inputs, sampling bookkeeping, outputs, stats).

The target's forward is stubbed by a recorded result: `ModelRunner.run` builds the graph path's
inputs as the real one does (graph_inputs.decode_rows and DecodeInputs.fill, on the CPU, no copy)
and returns fixed logits; `greedy_tokens` hands back a host tensor's rows as the graph's in-graph
argmax copy would. Everything else is the engine's own code, unchanged. The same workload as
`infersight bench runtime` (prefix caching off, no observer; --probes adds the ProbeObserver).

    taskset -c 1 python benchmarks/host_step.py --batch 32 --context 512 --steps 400
    taskset -c 1 python benchmarks/host_step.py --ab HEAD --rounds 9      # before (git rev) / after
    python benchmarks/host_step.py --profile                             # cProfile of the steps

--ab REV runs the script in subprocesses, alternately on `git archive REV`'s infersight/ (before)
and on this tree (after), REV twice per round (A/A: the noise floor), and prints median µs per
step of each, the paired after/before ratio and the A/A ratio.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def build_engine(batch: int, context: int, steps: int, probes: bool, model: str):  # noqa: ANN201
    from infersight.runtime import Engine, EngineConfig, SamplingParams
    from infersight.runtime.runner.cuda_graphs import batch_buckets, bucket_for, width_buckets
    from infersight.runtime.runner.graph_inputs import DecodeInputs, decode_rows

    block = 16
    max_len = context + steps + 64
    per_seq = -(-max_len // block)
    observer = None
    if probes:
        from infersight.probes.config import ProbeConfig
        from infersight.probes.observer import ProbeObserver

        observer = ProbeObserver(ProbeConfig(ring_name=f"infersight-hoststep-{os.getpid()}"))
    config = EngineConfig(model=model, enable_prefix_caching=False, max_num_seqs=batch,
                          max_num_batched_tokens=batch * context, block_size=block, max_model_len=max_len,
                          num_kv_blocks=batch * per_seq + 4)
    engine = Engine(config, observer)
    runner = engine.target
    vocab = config.model_config.vocab_size
    fake = torch.zeros(batch * context, vocab)
    fake[:, 65] = 1.0  # greedy: token 65 every step, never EOS
    inputs = DecodeInputs(batch, per_seq, block, pad_block=config.num_kv_blocks, device="cpu")
    buckets, widths = batch_buckets(batch), width_buckets(per_seq)
    host_tokens = torch.full((batch,), 65, dtype=torch.long)
    pending = [0]

    def run(items, expert_counts=None, graphs_while_profiling=False):  # noqa: ANN001, ANN202
        rows = decode_rows(items, block)
        pending[0] = 0
        if rows is not None:  # the graph path's host work, then "the replay"
            bucket = bucket_for(len(rows), buckets)
            widest = rows.max_blocks if hasattr(rows, "max_blocks") else max(len(r.blocks) for r in rows)
            inputs.fill(rows, bucket, bucket_for(widest, widths), copy=False)
            pending[0] = len(rows)
        logits = fake[:sum(it.logits for it in items)]
        runner.last_logits = logits
        if rows_class is not None:  # what this tree's ModelRunner.run returns
            return rows_class(logits, [it.logits for it in items])
        return list(logits.split([it.logits for it in items]))

    def greedy_tokens(rows: int):  # noqa: ANN202
        if not rows or pending[0] != rows:
            return None
        pending[0] = 0
        return host_tokens[:rows].tolist()

    try:
        from infersight.runtime.runner.model_runner import LogitsRows as rows_class
    except ImportError:  # a tree from before LogitsRows: the runner split the logits
        rows_class = None
    runner.run = torch.inference_mode()(run)
    runner.greedy_tokens = greedy_tokens
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 32, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(torch.randint(3, 256, (context,), generator=gen).tolist(), params)
    while any(r.in_prefill or not r.output_token_ids for r in engine.requests.values()):
        engine.step()
    return engine, observer


def measure(batch: int, context: int, steps: int, warmup: int, probes: bool, model: str) -> dict:
    torch.set_num_threads(1)
    engine, observer = build_engine(batch, context, steps + warmup, probes, model)
    for _ in range(warmup):
        engine.step()
    times = []
    clock = time.perf_counter_ns
    for _ in range(steps):
        t0 = clock()
        engine.step()
        times.append(clock() - t0)
    tokens = sum(len(r.output_token_ids) for r in engine.requests.values())
    if observer is not None:
        observer.close()
    return {"median_us": statistics.median(times) / 1e3, "mean_us": statistics.fmean(times) / 1e3,
            "steps": steps, "batch": batch, "tokens": tokens}


def profile(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    engine, observer = build_engine(args.batch, args.context, args.steps + args.warmup, args.probes, args.model)
    for _ in range(args.warmup):
        engine.step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        engine.step()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if observer is not None:
        observer.close()


def ab(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.ab, "infersight"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        child = [sys.executable, str(Path(__file__).resolve()), "--batch", str(args.batch), "--context",
                 str(args.context), "--steps", str(args.steps), "--warmup", str(args.warmup), "--model", args.model,
                 "--json"] + (["--probes"] if args.probes else [])
        runs: dict[str, list[float]] = {"before": [], "before2": [], "after": []}
        order = ["before", "after", "before2"]
        for r in range(args.rounds):
            for name in order[r % 3:] + order[:r % 3]:  # rotated: no variant always first
                path = tmp if name.startswith("before") else str(ROOT)
                env = dict(os.environ, PYTHONPATH=path)
                out = subprocess.run(child, env=env, check=True, capture_output=True, text=True, cwd=tmp).stdout
                runs[name].append(json.loads(out.splitlines()[-1])["median_us"])
    ratio = [a / b for a, b in zip(runs["after"], runs["before"])]
    aa = [a / b for a, b in zip(runs["before2"], runs["before"])]
    print(json.dumps({name: [round(v, 1) for v in vals] for name, vals in runs.items()}))
    print(f"before {statistics.median(runs['before']):.1f} us/step, after {statistics.median(runs['after']):.1f} "
          f"us/step (batch {args.batch}, context {args.context}, {args.rounds} rounds of {args.steps} steps): "
          f"after/before {statistics.median(ratio):.3f}, A/A {statistics.median(aa):.3f} "
          f"(range {min(aa):.3f}-{max(aa):.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--model", default="tiny-draft")
    ap.add_argument("--probes", action="store_true", help="with the ProbeObserver (a ring, no agent)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ab", metavar="REV", help="before = infersight/ of this git revision, after = this tree")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    if min(args.batch, args.context, args.steps, args.rounds) < 1 or args.warmup < 0:
        print("host_step: --batch, --context, --steps and --rounds must be at least 1", file=sys.stderr)
        raise SystemExit(2)
    if args.ab:
        ab(args)
    elif args.profile:
        profile(args)
    else:
        result = measure(args.batch, args.context, args.steps, args.warmup, args.probes, args.model)
        print(json.dumps(result) if args.json else f"{result['median_us']:.1f} us/step median ({result})")


if __name__ == "__main__":
    main()
