"""What one flight-recorder window costs the engine, by this script's clock, many times over in one
short run; set beside what the recorder's own formula measures on the same steps.

At the default 0.5% budget a window comes once a minute or so, too rarely to resolve its amortised
cost by A/B in one short run. The recorder's token bucket keeps the *measured* cost under the
budget, so what must hold is that the measurement is right: amortised cost = budget x (true cost /
measured cost). This script asks for windows itself, through the engine's control block (no agent),
as the recorder does (`CaptureTool.TORCH_KERNELS`, --window-steps steps), in blocks of --block-steps
steady decode steps, alternating: a plain block, then a block whose first steps are a window, ...
Every step is timed by `perf_counter` around `engine.step()`.

- cost per window (A/B) = median time of the window blocks - median of the plain blocks (both the
  same number of steps of the same batch); noise floor: the A/A spread, 1.4826 x MAD of the plain
  blocks / sqrt(blocks) x sqrt(2);
- the recorder's measure: `agent.recorder_budget.window_cost` on the engine's own step timestamps
  (the STEP records' start_ns / end_ns), as the agent computes it;
- implied amortised cost at --budget: budget x A/B cost / recorder's measure.

    # H200 (≈ 30 s, untried there): llama-1b-shape decode
    python benchmarks/window_cost.py --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 \
        --context 512 --windows 16 --block-steps 64
    # CPU smoke run
    python benchmarks/window_cost.py --batch 2 --context 16 --windows 2 --block-steps 8

Prints `key: value` lines, then one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flight_recorder_cost import SteadyDecode, add_workload_args  # noqa: E402

from infersight.agent.recorder.budget import window_cost  # noqa: E402
from infersight.probes.config import ProbeConfig  # noqa: E402
from infersight.probes.control import CaptureState, CaptureTool  # noqa: E402
from infersight.probes.observer import ProbeObserver  # noqa: E402
from infersight.runtime import Engine, EngineConfig  # noqa: E402


def timed_steps(engine: Engine, work: SteadyDecode, n: int, log: list[dict]) -> float:
    """n steps, each logged (engine step id and stamps, this script's clock); their total seconds."""
    total = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        work.step()
        dt = time.perf_counter() - t0
        total += dt
        s = engine.last_stats
        log.append({"step_id": s.step_id, "start_ns": s.start_ns, "end_ns": s.end_ns, "batch_size": len(s.batch),
                    "script_s": dt})
    return total


def spread(values: list[float]) -> float:
    med = statistics.median(values)
    return 1.4826 * statistics.median([abs(v - med) for v in values])


def run(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="infersight-window-cost-"))
    probe = ProbeObserver(ProbeConfig(ring_name=f"infersight-wincost-{os.getpid()}", capture_dir=str(tmp)))
    max_len = args.context + args.max_tokens + 16
    engine = Engine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype, max_num_seqs=args.batch,
                                 max_model_len=max_len, num_kv_blocks=args.batch * -(-max_len // 16) + 16), probe)
    engine.last_stats = None
    step = engine.step

    def keep_stats():  # noqa: ANN202 -- StepStats
        engine.last_stats = step()
        return engine.last_stats

    engine.step = keep_stats
    work = SteadyDecode(engine, args.batch, args.context, args.max_tokens)
    log: list[dict] = []
    plain, windowed, firsts = [], [], []
    try:
        timed_steps(engine, work, 50, [])  # prefill and warm-up
        control = probe.control
        for _ in range(args.windows):
            plain.append(timed_steps(engine, work, args.block_steps, log))
            seq = control.request(args.window_steps, CaptureTool.TORCH_KERNELS)
            firsts.append(len(log))
            windowed.append(timed_steps(engine, work, args.block_steps, log))
            if not (control.ack_seq >= seq and control.state in (CaptureState.DONE, CaptureState.FAILED)):
                raise RuntimeError("a window outlasted its block: raise --block-steps")
    finally:
        probe.close()
    steps = pd.DataFrame(log)
    measured = []
    for i in firsts:
        first = int(steps.at[i, "step_id"])
        cost = window_cost(steps, first, args.window_steps, args.after_steps)
        measured.append(cost.cost_s if cost is not None else float("nan"))
    ab = statistics.median(windowed) - statistics.median(plain)
    recorder = statistics.median(measured)
    return {"model": args.model, "device": args.device, "batch": args.batch, "context": args.context,
            "window_steps": args.window_steps, "block_steps": args.block_steps, "windows": args.windows,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "cuda_graphs": engine.target.graphs is not None,
            "plain_block_s": plain, "window_block_s": windowed,
            "window_cost_ab_s": ab, "noise_floor_s": spread(plain) / len(plain) ** 0.5 * 2 ** 0.5,
            "window_cost_recorder_s": measured, "window_cost_recorder_median_s": recorder,
            "step_s_median": statistics.median(steps["script_s"]),
            "implied_amortised_cost": args.budget * ab / recorder if recorder > 0 else None,
            "budget": args.budget}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(p, batch=2, context=16, max_tokens=2048)
    p.add_argument("--windows", type=int, default=16)
    p.add_argument("--block-steps", type=int, default=64, help="steps per block (a window block starts with one)")
    p.add_argument("--after-steps", type=int, default=2, help="steps after a window charged to it (the recorder's)")
    args = p.parse_args(argv)
    if args.windows < 2 or args.block_steps < args.window_steps + args.after_steps + 2:
        print("window_cost: --windows must be >= 2 and --block-steps >= window + after steps + 2", file=sys.stderr)
        return 2
    result = run(args)
    for key in ("window_cost_ab_s", "noise_floor_s", "window_cost_recorder_median_s", "implied_amortised_cost",
                "step_s_median", "cuda_graphs"):
        print(f"{key}: {result[key]}", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
