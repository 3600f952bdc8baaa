"""The flight recorder's amortised cost in one short run (≤ 300 s on the H200), with its noise floor.

The variant of flight_recorder_cost.py that fits one device call: the agents start once, not once
per block. The engine is observed by a `SwitchObserver` over two ProbeObservers that write the same
records into two rings: ON blocks go to ring A, read by an agent with the flight recorder at the
given budget; OFF blocks go to ring B, drained by this script between blocks (outside the timing).
Both write the same records, so the probes cost the same in both; the difference is the recorder's
windows. The recorder earns its allowance only from the steps it sees (the ON blocks), so its
budget is a share of ON time, as in production. An ON block that ends while a window is asked for
or running goes on until the window and the steps charged to it are done, so no window's cost
falls into an OFF block. Blocks of --block-s seconds in ABBA order (OFF ON ON OFF ...).

Reported: overhead = 1 - (ON tokens / ON wall time) / (OFF tokens / OFF wall time), pooled over
blocks (windows are sparse: at 0.5% most blocks hold none, so a median of blocks would miss them);
its noise floor: the OFF blocks' relative standard deviation x sqrt(1/ON blocks + 1/OFF blocks), the
standard error of that difference if there were no recorder; each window's cost told by a separate
clock (an ON block's wall time beyond its tokens at the OFF rate, over the windows in it) beside the
recorder's own measurement (STEP records); the recorder's cost_ratio; and the category shares of the sampled windows against one long capture of
--long-steps steps taken the same way (kernel activity only), in points per category.

    # H200: llama-1b-shape decode at the default budget, ~4 min
    python benchmarks/flight_recorder_quick.py --model llama-1b-shape --device cuda --dtype bfloat16 \
        --batch 32 --context 512 --block-s 8 --rounds 6 --long-steps 100
    # CPU smoke run
    python benchmarks/flight_recorder_quick.py --model tiny-moe --batch 2 --context 16 --budget 0.3 \
        --block-s 2 --rounds 1 --warm-s 2 --long-steps 4

Prints `key: value` lines, then one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flight_recorder_cost import (  # noqa: E402
    SteadyDecode, add_workload_args, agent_command, free_port, long_capture, pooled_rate, print_result, stop_agent,
    summary, window_comparison,
)

from infersight.bench.engine.switch import SwitchObserver  # noqa: E402
from infersight.probes.config import ProbeConfig  # noqa: E402
from infersight.probes.control import CaptureState, ControlBlock  # noqa: E402
from infersight.probes.observer import ProbeObserver  # noqa: E402
from infersight.probes.records import record_registry  # noqa: E402
from infersight.probes.ring import RingConsumer  # noqa: E402
from infersight.runtime import Engine, EngineConfig  # noqa: E402

#: Steps after a window that its cost is measured over (the recorder's after_steps + the next one).
CHARGED_AFTER = 3


def window_busy(control: ControlBlock) -> bool:
    """A window is asked for and not yet taken, or running."""
    return control.request_seq != control.ack_seq or control.state == CaptureState.RUNNING


def run_block(work: SteadyDecode, switch: SwitchObserver, mode: str, block_s: float, control: ControlBlock,
              drain: RingConsumer) -> dict:
    switch.select(mode)
    drain.read()
    taken = control.ack_seq
    tokens, steps, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < block_s:
        tokens += work.step()
        steps += 1
    if mode == "on":  # finish what the recorder started: its whole cost belongs to this block
        while window_busy(control):
            tokens += work.step()
            steps += 1
        if control.ack_seq != taken:
            for _ in range(CHARGED_AFTER):
                tokens += work.step()
                steps += 1
    wall = time.perf_counter() - start
    return {"mode": mode, "tokens_per_s": tokens / wall, "steps": steps, "wall_s": wall,
            "windows": control.ack_seq - taken}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(p, batch=2, context=16, max_tokens=2048)  # long requests: few prefills, windows see decode
    p.add_argument("--block-s", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=6, help="ABBA rounds (4 blocks each)")
    p.add_argument("--warm-s", type=float, default=10.0,
                   help="ON time before the blocks: the recorder takes and measures its first window")
    p.add_argument("--long-steps", type=int, default=100)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.block_s <= 0 or args.long_steps < 1:
        p.error("--rounds, --block-s and --long-steps must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.window_steps = max(1, args.window_steps)
    tmp = Path(tempfile.mkdtemp(prefix="infersight-recorder-quick-"))
    stem = f"infersight-recquick-{os.getpid()}"
    probe_on = ProbeObserver(ProbeConfig(ring_name=stem + "-on", capture_dir=str(tmp / "captures")))
    probe_off = ProbeObserver(ProbeConfig(ring_name=stem + "-off", capture_dir=str(tmp / "captures-off")))
    switch = SwitchObserver({"on": probe_on, "off": probe_off}, initial="off")
    engine = Engine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype, max_num_seqs=args.batch,
                                 max_model_len=args.context + args.max_tokens + 16,
                                 # KV for the whole batch at its longest: no preemptions, a steady workload
                                 num_kv_blocks=args.batch * -(-(args.context + args.max_tokens + 16) // 16) + 16), switch)
    drain = RingConsumer.attach(probe_off.ring_name, record_registry())
    work = SteadyDecode(engine, args.batch, args.context, args.max_tokens)
    for _ in range(50):  # prefill and warm-up
        work.step()
    drain.read()
    port = free_port()
    agent = subprocess.Popen(agent_command(probe_on.ring_name, port, True, args, str(tmp / "windows")),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    blocks: list[dict] = []
    t_start = time.monotonic()
    try:
        switch.select("on")
        deadline = time.monotonic() + 120
        while (got := summary(port)) is None or probe_on.ring_name not in got.get("rings", {}):
            if time.monotonic() > deadline:
                raise RuntimeError("the agent did not attach within 120 s")
            for _ in range(20):
                work.step()
        blocks.append(run_block(work, switch, "on", args.warm_s, probe_on.control, drain))  # not counted
        for _ in range(args.rounds):
            for mode in ("off", "on", "on", "off"):
                blocks.append(run_block(work, switch, mode, args.block_s, probe_on.control, drain))
                b = blocks[-1]
                print(f"block {len(blocks) - 1}: {mode:>3} {b['tokens_per_s']:.1f} tok/s, {b['steps']} steps, "
                      f"{b['windows']} windows", file=sys.stderr)
        switch.select("on")
        for _ in range(30):  # the last window's cost reaches the agent
            work.step()
        time.sleep(1.0)
        rec = (summary(port) or {}).get("flight_recorder") or {}
    finally:
        stop_agent(agent)
    try:
        long = long_capture(work, probe_on, args.long_steps)
    finally:
        drain.close()
        probe_on.close()
        probe_off.close()
    timed = blocks[1:]
    rounds = [timed[4 * r:4 * r + 4] for r in range(args.rounds)]
    per_round = [(r[1]["tokens_per_s"] + r[2]["tokens_per_s"]) / (r[0]["tokens_per_s"] + r[3]["tokens_per_s"])
                 for r in rounds]
    on = [b["tokens_per_s"] for b in timed if b["mode"] == "on"]
    off = [b["tokens_per_s"] for b in timed if b["mode"] == "off"]
    off_rate, on_rate = pooled_rate(timed, "off"), pooled_rate(timed, "on")
    off_sd = statistics.stdev(off) / statistics.mean(off) if len(off) > 1 else None
    clean_on = [b["tokens_per_s"] for b in timed if b["mode"] == "on" and b["windows"] == 0]
    # A window's cost by this script's clock: its block's wall time beyond what its tokens take at the OFF rate.
    extra = [(b["wall_s"] - b["tokens_per_s"] * b["wall_s"] / off_rate, b["windows"]) for b in timed
             if b["mode"] == "on" and b["windows"]]
    result = {
        "model": args.model, "device": args.device, "dtype": args.dtype, "batch": args.batch, "context": args.context,
        "budget": args.budget, "window_steps": args.window_steps, "block_s": args.block_s, "rounds": args.rounds,
        "machine": platform.node(), "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cuda_graphs": engine.target.graphs is not None, "wall_s": time.monotonic() - t_start,
        "off_tokens_per_s": off, "on_tokens_per_s": on, "windows_per_block": [b["windows"] for b in timed],
        "overhead": 1.0 - on_rate / off_rate,
        "noise_floor": off_sd * (1 / len(on) + 1 / len(off)) ** 0.5 if off_sd is not None else None,
        "off_block_sd": off_sd,
        "overhead_median_of_rounds": 1.0 - statistics.median(per_round),
        "overhead_clean_on_blocks": 1.0 - statistics.mean(clean_on) / statistics.mean(off) if clean_on else None,
        "window_cost_by_blocks_s": [e / w for e, w in extra],
        "recorder_cost_ratio": rec.get("cost_ratio"), "recorder_engine_s": rec.get("engine_seconds"),
        "recorder_cost_s": rec.get("cost_seconds"), **window_comparison(tmp / "windows", long),
    }
    print_result(result, ("overhead", "noise_floor", "off_block_sd", "overhead_median_of_rounds",
                          "overhead_clean_on_blocks", "recorder_cost_ratio", "windows", "window_costs_s",
                          "window_cost_by_blocks_s", "window_noise_median_s", "max_share_diff_points", "wall_s"))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
