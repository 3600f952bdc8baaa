"""What the flight recorder costs a decoding engine, measured from outside it, and whether its sampled
windows see the same kernel mix as one long capture.

1. Amortised cost (A/B, with its noise floor). The engine decodes a steady batch in this process;
   an agent runs beside it as its own process (`infersight agent`, as in production), with the
   flight recorder (ON) or without (OFF), in blocks of --block-s seconds ordered OFF ON ON OFF ...
   (ABBA: a slow drift of the machine cancels). Each block counts decode tokens per second of wall
   time after the agent has attached. overhead = 1 - ON tokens/s / OFF tokens/s, each pooled over
   its blocks (windows are sparse: a median of blocks would miss them). The noise floor is
   the spread of the OFF blocks (1.4826 x MAD / median, over sqrt(blocks)): an overhead below it is
   not told apart from the machine's jitter. The recorder's own measurement (its cost_ratio, from
   the agent's /api/v1/summary at the end of each ON block) is printed beside it.
2. Category shares. The ON blocks' window summaries (--recorder-dir) are summed by category and
   compared with one long capture of --long-steps steps of the same workload, taken the same way
   (kernel activity only), in percentage points per category.

    # H200 (the lead's run): llama-1b-shape decode at the default budget
    python benchmarks/flight_recorder_cost.py --model llama-1b-shape --device cuda --dtype bfloat16 \
        --batch 32 --context 512 --budget 0.005 --block-s 60 --rounds 3 --long-steps 200
    # CPU smoke run (small shapes; a CPU window costs ~0.1-0.5 s, so a large budget)
    python benchmarks/flight_recorder_cost.py --model tiny-moe --batch 4 --context 64 --budget 0.2 \
        --block-s 8 --rounds 1 --long-steps 16

Prints `key: value` lines, then one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from infersight.agent.recorder.window import analyze_window
from infersight.probes.config import ProbeConfig
from infersight.probes.control import CaptureState, CaptureTool
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig, SamplingParams


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SteadyDecode:
    """A batch of `batch` requests kept full: each finished one is replaced by a fresh prompt. The
    first ones stop at staggered lengths, so the batch always holds every age (context) evenly: the
    workload is the same at every moment, and a sample of it can be compared with a long capture."""

    def __init__(self, engine: Engine, batch: int, context: int, max_tokens: int) -> None:
        self.engine, self.context, self.max_tokens = engine, context, max_tokens
        self.live: set[int] = set()
        self.n = 0
        for k in range(batch):
            self._add(max(1, max_tokens * (k + 1) // batch))

    def _add(self, max_tokens: int | None = None) -> None:
        self.n += 1
        prompt = [(self.n * 7 + i) % 200 + 3 for i in range(self.context)]  # distinct: no prefix-cache hits
        params = SamplingParams(temperature=0, max_tokens=max_tokens or self.max_tokens, ignore_eos=True)
        self.live.add(self.engine.add_request(prompt, params))

    def step(self) -> int:
        """One engine step; the decode tokens it produced."""
        stats = self.engine.step()
        for rid in stats.finished:
            self.live.discard(rid)
            self.engine.release(rid)
            self._add()
        return stats.num_decode_tokens


def agent_command(ring: str, port: int, on: bool, args: argparse.Namespace, recorder_dir: str) -> list[str]:
    cmd = [sys.executable, "-m", "infersight", "agent", "--ring", ring, "--listen", f"127.0.0.1:{port}",
           "--gpu-source", "none", "--poll-interval", "0.1"]
    if on:
        cmd += ["--flight-recorder", "--recorder-budget", str(args.budget), "--recorder-dir", recorder_dir,
                "--recorder-window-steps", str(args.window_steps), "--recorder-preemption-storm", "0",
                "--recorder-step-jump", "0"]
    return cmd


def summary(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/summary", timeout=2) as resp:  # noqa: S310
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def stop_agent(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_block(work: SteadyDecode, ring: str, on: bool, args: argparse.Namespace, recorder_dir: str) -> dict:
    """One block: start the agent, step until it has attached (and --settle-s more), then count."""
    port = free_port()
    proc = subprocess.Popen(agent_command(ring, port, on, args, recorder_dir), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for _ in range(20):
                work.step()
            got = summary(port)
            if got is not None and ring in got.get("rings", {}):
                break
        else:
            raise RuntimeError("the agent did not attach within 120 s")
        settle = time.monotonic() + args.settle_s
        while time.monotonic() < settle:
            work.step()
        tokens, steps, start = 0, 0, time.perf_counter()
        while time.perf_counter() - start < args.block_s:
            tokens += work.step()
            steps += 1
        wall = time.perf_counter() - start
        rec = (summary(port) or {}).get("flight_recorder") if on else None
    finally:
        stop_agent(proc)
    return {"mode": "on" if on else "off", "tokens_per_s": tokens / wall, "steps": steps, "wall_s": wall,
            "recorder": rec}


def long_capture(work: SteadyDecode, probe: ProbeObserver, steps: int) -> dict[str, float]:
    """One capture of `steps` steps (kernel activity only, as the windows): time share by category."""
    block = probe.control  # the engine's own control block: no agent runs now
    seq = block.request(steps, CaptureTool.TORCH_KERNELS)
    while not (block.ack_seq >= seq and block.state in (CaptureState.DONE, CaptureState.FAILED)):
        work.step()
    path, first = block.path, block.first_step
    summary_, _ = analyze_window(path, first)
    return shares([r for r in summary_.as_dict()["time"]])


def shares(rows: list[dict]) -> dict[str, float]:
    total = sum(r["time_ns"] for r in rows) or 1
    out: dict[str, float] = {}
    for r in rows:
        out[r["op_category"]] = out.get(r["op_category"], 0.0) + r["time_ns"] / total
    return out


def window_comparison(window_dir: Path, long: dict[str, float]) -> dict:
    """The recorder's window summaries in `window_dir`: their count and measured costs, and their
    category shares summed against the long capture's (`long`), in points per category."""
    windows = [json.loads(f.read_text()) for f in sorted(window_dir.glob("window-*.json"))]
    sampled = shares([r for w in windows if "summary" in w for r in w["summary"]["time"]])
    diff = {c: 100 * (sampled.get(c, 0.0) - long.get(c, 0.0)) for c in sorted(set(sampled) | set(long))}
    costs = [w["cost"] for w in windows if w.get("cost")]
    return {"windows": len(windows), "window_costs_s": [c["cost_s"] for c in costs],
            "window_cost_median_s": statistics.median(c["cost_s"] for c in costs) if costs else None,
            "window_noise_median_s": statistics.median(c["noise_s"] for c in costs) if costs else None,
            "sampled_shares": sampled, "long_capture_shares": long, "share_diff_points": diff,
            "max_share_diff_points": max((abs(v) for v in diff.values()), default=None)}


def print_result(result: dict, keys: tuple[str, ...]) -> None:
    """`key: value` lines, then one line per category share."""
    for key in keys:
        print(f"{key}: {result[key]}")
    sampled, long = result["sampled_shares"], result["long_capture_shares"]
    for c, d in result["share_diff_points"].items():
        print(f"share {c}: sampled {100 * sampled.get(c, 0):.1f}%  long {100 * long.get(c, 0):.1f}%  diff {d:+.1f} points")


def pooled_rate(blocks: list[dict], mode: str) -> float:
    """Tokens per second over all the blocks of one mode together."""
    mine = [b for b in blocks if b["mode"] == mode]
    return sum(b["tokens_per_s"] * b["wall_s"] for b in mine) / sum(b["wall_s"] for b in mine)


def robust_noise(values: list[float]) -> float:
    """1.4826 x MAD / median over sqrt(n): the relative noise of a median of these blocks."""
    med = statistics.median(values)
    mad = statistics.median([abs(v - med) for v in values])
    return 1.4826 * mad / med / max(len(values), 1) ** 0.5


def add_workload_args(p: argparse.ArgumentParser, batch: int, context: int, max_tokens: int) -> None:
    """The engine, the steady workload and the recorder's flags both recorder benchmarks share."""
    p.add_argument("--model", default="tiny-moe")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--context", type=int, default=context)
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="tokens per request before it is replaced")
    p.add_argument("--budget", type=float, default=0.005)
    p.add_argument("--window-steps", type=int, default=4)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(p, batch=4, context=64, max_tokens=512)
    p.add_argument("--block-s", type=float, default=60.0)
    p.add_argument("--settle-s", type=float, default=2.0, help="steps after the agent attaches, not counted")
    p.add_argument("--rounds", type=int, default=3, help="ABBA rounds (4 blocks each)")
    p.add_argument("--long-steps", type=int, default=200)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    tmp = Path(tempfile.mkdtemp(prefix="infersight-recorder-bench-"))
    ring = f"infersight-recbench-{os.getpid()}"
    probe = ProbeObserver(ProbeConfig(ring_name=ring, capture_dir=str(tmp / "captures")))
    engine = Engine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype, max_num_seqs=args.batch,
                                 max_model_len=args.context + args.max_tokens + 16,
                                 # KV for the whole batch at its longest: no preemptions, a steady workload
                                 num_kv_blocks=args.batch * -(-(args.context + args.max_tokens + 16) // 16) + 16), probe)
    work = SteadyDecode(engine, args.batch, args.context, args.max_tokens)
    for _ in range(50):
        work.step()  # prefill and warm-up
    blocks = []
    try:
        for _ in range(args.rounds):
            for on in (False, True, True, False):
                blocks.append(run_block(work, ring, on, args, str(tmp / "windows")))
                b = blocks[-1]
                print(f"block {len(blocks)}: {b['mode']:>3} {b['tokens_per_s']:.1f} tok/s over {b['steps']} steps",
                      file=sys.stderr)
        long = long_capture(work, probe, args.long_steps)
    finally:
        probe.close()
    off = [b["tokens_per_s"] for b in blocks if b["mode"] == "off"]
    on = [b["tokens_per_s"] for b in blocks if b["mode"] == "on"]
    recs = [b["recorder"] for b in blocks if b["recorder"]]
    result = {
        "model": args.model, "device": args.device, "dtype": args.dtype, "batch": args.batch, "context": args.context,
        "budget": args.budget, "window_steps": args.window_steps, "block_s": args.block_s, "rounds": args.rounds,
        "machine": platform.node(), "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "off_tokens_per_s": off, "on_tokens_per_s": on,
        # Pooled, not a median of blocks: windows are sparse, most blocks hold none.
        "overhead": 1.0 - pooled_rate(blocks, "on") / pooled_rate(blocks, "off"),
        "overhead_median_of_blocks": 1.0 - statistics.median(on) / statistics.median(off),
        "noise_floor": robust_noise(off) if len(off) > 1 else None,
        "recorder_cost_ratio": [r["cost_ratio"] for r in recs], **window_comparison(tmp / "windows", long),
    }
    if not args.json:
        print_result(result, ("overhead", "noise_floor", "recorder_cost_ratio", "windows", "window_cost_median_s",
                              "window_noise_median_s", "max_share_diff_points"))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
