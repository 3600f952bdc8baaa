"""Expert-parallel benchmark: steady decode on W ranks (one GPU each, NCCL), then the same decode
with an EPLB-style replication plan applied.

Prints, from rank 0, `key: value` lines and then one JSON object as the last line:
- the share of MoE layer time spent in all-to-all (dispatch + combine) and in all communication
  (plus the all-gather that re-replicates the output), per layer and overall;
- per-rank token load (load / mean), compute time and straggler counts;
- the replication plan (--replicas extra expert copies per layer) and its predicted max/mean rank balance;
- the balance measured with that plan applied in the runtime (tokens of a replicated expert are
  split round-robin over its copies), with the step time and the all-to-all share again;
- bytes per peer (mean bytes rank r dispatches to rank p in one layer of one step, a W x W matrix),
  the straggler rank of every measured step (and its compute skew), and per rank the parameter
  bytes it holds and its peak device memory.
With --out DIR (default: $OUT when set) rank 0 also writes the report to
DIR/ep_w<W>_<model>_<layers>l.json. `bash benchmarks/gpu.sh expert_parallel_x4` (and _x8) runs it on 4 and 8 GPUs.

On a host with >= 2 GPUs (the command the issue asks for; NVLink multicast stays off):

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    torchrun --standalone --nproc-per-node 2 benchmarks/ep_bench.py --model mixtral-shape --layers 8

    # W = every GPU of the host:
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    torchrun --standalone --nproc-per-node "$(nvidia-smi -L | wc -l)" benchmarks/ep_bench.py \
        --model mixtral-shape --layers 8

`python benchmarks/ep_bench.py --world N ...` starts that torchrun itself. The script also sets the
three variables in every rank before NCCL starts. Each rank builds only the experts it hosts
(runtime/parallel/local_model.py): mixtral-shape at bf16 is about 93 GB with all 32 layers and
23 GB with --layers 8 in one process, while a rank of W = 4 holds the dense parts and 2 experts per
layer (25 GB for 32 layers; 8 layers: 6.3 GB), plus its replicas. A CPU run (gloo, W = 4):

    torchrun --nnodes 1 --nproc-per-node 4 --master-addr 127.0.0.1 --master-port 29533 \
        benchmarks/ep_bench.py --device cpu --model tiny-moe --layers 0 --dtype float32 \
        --batch 8 --prompt-len 16 --warmup 2 --steps 12
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from infersight.correlate import expert_parallel as epa
from infersight.correlate.frames import EventFrames, update_labels
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime.config import EngineConfig, resolve_model
from infersight.runtime.parallel.engine import ExpertParallelEngine
from infersight.runtime.parallel.group import NVLS_OFF_ENV, EPGroup, init_from_env
from infersight.commands.ep_launch import ep_ring_name
from infersight.runtime.parallel.placement import LayerPlacement
from infersight.runtime.engine.sampling import SamplingParams

# Every rank, before any NCCL communicator exists (importing torch creates none): multicast off.
os.environ.update(NVLS_OFF_ENV)
#: Prefill steps allowed before the decode phase must have begun (a guard against a stuck schedule).
MAX_PREFILL_STEPS = 10_000


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=None,
                    help="without torchrun: start torchrun with this many ranks (default: every GPU)")
    ap.add_argument("--model", default="mixtral-shape")
    ap.add_argument("--layers", type=int, default=8, help="override the model's layer count (0: keep it)")
    ap.add_argument("--device", default="auto", help="auto (cuda:LOCAL_RANK when available), cuda or cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=64, help="concurrent requests decoding")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=8, help="decode steps before measuring")
    ap.add_argument("--steps", type=int, default=64, help="measured decode steps")
    ap.add_argument("--replicas", type=int, default=None,
                    help="extra expert copies per layer for the plan (default: the world size)")
    ap.add_argument("--no-apply", action="store_true", help="only predict; do not rerun with the plan applied")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank on CPU")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="directory for the JSON report (default: $OUT)")
    return ap.parse_args(argv)


def relaunch(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Not under torchrun: start it, one rank per GPU, with multicast off in its environment."""
    world = args.world or torch.cuda.device_count()
    if world < 2:
        print(f"expert parallelism needs >= 2 ranks; this host has {torch.cuda.device_count()} GPUs "
              "(use --world 2 --device cpu for a CPU smoke run)", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           os.path.abspath(__file__), *[a for a in argv if not a.startswith("--world")]]
    return subprocess.call(cmd, env={**os.environ, **NVLS_OFF_ENV})


def engine_config(args: argparse.Namespace, device: str) -> EngineConfig:
    model = resolve_model(args.model)
    if args.layers and args.layers != model.n_layers:
        # renamed: a shipped weights file of the full-depth model would not fit (random init instead)
        model = dataclasses.replace(model, name=f"{model.name}-{args.layers}l", n_layers=args.layers)
    max_len = args.prompt_len + args.warmup + args.steps + 8
    return EngineConfig(model=model, device=device, dtype=args.dtype, seed=args.seed,
                        enable_prefix_caching=False, max_num_seqs=args.batch,
                        max_num_batched_tokens=max(512, args.batch), block_size=16,
                        # room for every request, and at least one max-length sequence (the config demands it)
                        num_kv_blocks=max(args.batch * -(-max_len // 16), -(-model.max_seq_len // 16)) + 16)


def decode_run(group: EPGroup, args: argparse.Namespace,
               placements: Mapping[int, LayerPlacement] | None) -> dict[str, Any]:
    """Prefill args.batch prompts, decode args.warmup steps, then measure args.steps decode steps.
    Returns this rank's ep frame for the measured steps and their wall times."""
    config = engine_config(args, group.device)
    observer = ProbeObserver(ProbeConfig(ring_name=ep_ring_name("infersight-epbench", group.rank),
                                         ring_capacity=1 << 18))
    consumer = RingConsumer.attach(observer.ring_name, record_registry())
    frames, labels = EventFrames(), {0: "other"}

    def drain() -> None:
        nonlocal frames, labels
        records = consumer.read()
        labels = update_labels(labels, records)
        batch = EventFrames.from_records(records, labels)
        frames = frames.concat(EventFrames(ep=batch.ep))  # only the EP stream is analysed here

    if group.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(group.device)
    try:
        engine = ExpertParallelEngine(config, group, observer, placements)
        param_bytes = sum(p.numel() * p.element_size() for p in engine.target.model.parameters())
        rng = random.Random(args.seed)
        params = SamplingParams(temperature=0.0, max_tokens=args.warmup + args.steps + 4, ignore_eos=True)
        for _ in range(args.batch):
            engine.add_request([rng.randrange(256) for _ in range(args.prompt_len)], params)
        dist.barrier()
        for _ in range(MAX_PREFILL_STEPS):  # prefill, chunked by the token budget
            stats = engine.step()
            if stats.num_prefill_tokens == 0 and stats.num_running == args.batch:
                break
        else:
            raise RuntimeError(f"decode did not start within {MAX_PREFILL_STEPS} steps")
        for _ in range(args.warmup):
            engine.step()
        drain()
        measured, step_s = [], []
        for i in range(args.steps):
            t0 = time.perf_counter()
            stats = engine.step()
            step_s.append(time.perf_counter() - t0)
            measured.append(stats.step_id)
            if i % 16 == 15:
                drain()
        drain()
        ep = frames.ep[frames.ep["step_id"].isin(measured)].reset_index(drop=True)
        peak = torch.cuda.max_memory_allocated(group.device) if group.device.startswith("cuda") else None
        return {"ep": ep, "step_s": step_s, "n_experts": config.model_config.n_experts,
                "param_bytes": param_bytes, "peak_device_bytes": peak}
    finally:
        consumer.close()
        observer.close()
        engine = None  # noqa: F841 - free this engine's model before the next one is built
        gc.collect()
        if group.device.startswith("cuda"):
            torch.cuda.empty_cache()


def gather(group: EPGroup, value: Any) -> list[Any]:
    out: list[Any] = [None] * group.world
    dist.all_gather_object(out, value)
    return out


def peer_matrix(ep: pd.DataFrame, world: int) -> list[list[float]]:
    """[r][p]: mean bytes rank r dispatched to rank p in one MoE layer of one step (p == r: a local copy)."""
    mean = epa.peer_bytes(ep).groupby(["rank", "peer"])["bytes"].mean()
    return [[float(mean.get((r, p), 0.0)) for p in range(world)] for r in range(world)]


def summarize(ep: pd.DataFrame, step_s: list[float], batch: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's figures, from every rank's ep frame (concatenated) and each rank's decode_run result."""
    world = len(ranks)
    share = epa.a2a_share(ep, by=())
    by_layer = epa.a2a_share(ep)
    hot = epa.hot_ranks(ep)
    loads = epa.rank_load(ep)
    balance = loads.groupby("layer")["load_over_mean"].max()
    strag = epa.stragglers(ep)
    return {
        "step_ms_median": 1e3 * float(np.median(step_s)), "decode_tokens_per_s": batch / float(np.median(step_s)),
        "a2a_share": float(share["a2a_share"].iloc[0]), "comm_share": float(share["comm_share"].iloc[0]),
        "a2a_share_by_layer": [round(float(v), 4) for v in by_layer["a2a_share"]],
        "rank_load_over_mean": [round(float(v), 4) for v in hot["load_over_mean"]],
        "rank_compute_s": [round(float(v), 6) for v in hot["compute_s"]],
        "straggler_steps": [int(v) for v in hot["straggler_steps"]],
        "compute_skew_median": float(strag["skew"].median()),
        "balance_by_layer": [round(float(v), 4) for v in balance],
        "balance_mean": float(balance.mean()), "balance_max": float(balance.max()),
        "a2a_share_by_rank": [round(float(v), 4) for v in epa.a2a_share(ep, by=("rank",))["a2a_share"]],
        "bytes_per_peer_per_layer_step": peer_matrix(ep, world),
        "straggler_by_step": [int(v) for v in strag["straggler"]],
        "straggler_skew_by_step": [round(float(v), 4) for v in strag["skew"]],
        "param_bytes_by_rank": [int(r["param_bytes"]) for r in ranks],
        "peak_device_bytes_by_rank": [r["peak_device_bytes"] for r in ranks],
    }


def write_report(report: dict[str, Any], out_dir: str) -> Path:
    """The report as DIR/ep_w<W>_<model>_<layers>l.json (rank 0 only)."""
    path = Path(out_dir) / f"ep_w{report['world']}_{report['model']}_{report['layers']}l.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"report: {path}")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if "RANK" not in os.environ:
        return relaunch(args, argv)
    group = init_from_env(args.device)
    if group.device == "cpu":
        torch.set_num_threads(args.threads)
    replicas = args.replicas if args.replicas is not None else group.world
    before = gather(group, decode_run(group, args, None))
    ep = pd.concat([r["ep"] for r in before], ignore_index=True)
    plans = epa.replication_plans(ep, replicas) if group.rank == 0 else None
    shared: list[Any] = [None if plans is None else {int(r.layer): list(r.replicas) for r in plans.itertuples()}]
    dist.broadcast_object_list(shared, src=0)
    report: dict[str, Any] = {}
    if group.rank == 0:
        report = {"command": " ".join([os.path.basename(sys.argv[0]), *argv]), "torch": torch.__version__,
                  "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "gpu": torch.cuda.get_device_name(group.device) if group.device.startswith("cuda") else None,
                  "model": args.model, "layers": args.layers, "dtype": args.dtype, "world": group.world,
                  "device": group.device, "backend": dist.get_backend(), "batch": args.batch,
                  "measured_steps": args.steps, "replicas_per_layer": replicas,
                  "before": summarize(ep, before[0]["step_s"], args.batch, before),
                  "plan_replicas": {k: [list(p) for p in v] for k, v in shared[0].items()},
                  "plan_balance_before_mean": float(plans["balance_before"].mean()),
                  "plan_balance_after_mean": float(plans["balance_after"].mean()),
                  "plan_balance_after_by_layer": [round(float(v), 4) for v in plans["balance_after"]]}
    if not args.no_apply and replicas > 0:
        n_experts = before[0]["n_experts"]
        placements = {layer: LayerPlacement.contiguous(n_experts, group.world).with_replicas(map(tuple, reps))
                      for layer, reps in shared[0].items()}
        after = gather(group, decode_run(group, args, placements))
        if group.rank == 0:
            ep_after = pd.concat([r["ep"] for r in after], ignore_index=True)
            report["after"] = summarize(ep_after, after[0]["step_s"], args.batch, after)
            # predicted (even splits over copies, from the home run's loads) against measured (the
            # records of the run with the plan applied: round-robin splits, the same requests)
            report["plan_vs_measured"] = [
                {"layer": int(r.layer), "home_measured": home, "predicted": round(float(r.balance_after), 4),
                 "measured": measured}
                for r, home, measured in zip(plans.itertuples(), report["before"]["balance_by_layer"],
                                             report["after"]["balance_by_layer"])]
    if group.rank == 0:
        for key, value in report.items():
            print(f"{key}: {value}")
        if args.out:
            write_report(report, args.out)
        print(json.dumps(report))
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
