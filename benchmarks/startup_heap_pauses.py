"""What freezing the start-up heap does to the cyclic collector's pauses in an engine process that serves.

`serve`'s engine process (and its HTTP process) freeze what start-up left once warm (serve/startup_heap.py).
This measures what that changes on the engine's own thread: each arm is a fresh interpreter built as the engine
process builds itself (ProbeObserver, Engine, graph capture, the profiler's warm-up), then frozen or not, then
stepping a closed loop of requests (a new request whenever one ends, prompts of varied length) for --seconds.
Every collection is timed through `gc.callbacks` (start to stop, by generation), every step by the clock around
`step()`. Arms alternate, --rounds each, a fresh process every time.

Reported per arm (measured): objects tracked and frozen at the start of stepping; what a full collection costs
then (three forced `gc.collect()`, median: the pause a full collection makes whenever the collector's own rule
calls one, which a short run may not see); during the stepping, full (generation-2) collections with their median
and largest pause, pause seconds per minute of stepping for each generation, and step time p50 / p99 / max.

    python benchmarks/startup_heap_pauses.py --seconds 60 --rounds 3
    python benchmarks/startup_heap_pauses.py --seconds 5 --rounds 1           # smoke run
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARMS = ("thawed", "frozen")


def _one_arm(args: argparse.Namespace) -> dict:
    from infersight.probes.config import ProbeConfig
    from infersight.probes.observer import ProbeObserver
    from infersight.runtime import Engine, EngineConfig, SamplingParams
    from infersight.serve.startup_heap import freeze_startup_heap

    probe = ProbeObserver(ProbeConfig(ring_name=f"infersight-gc-bench-{os.getpid()}"))
    try:
        engine = Engine(EngineConfig(model=args.model, device=args.device), probe)
        engine.capture_decode_graphs()
        probe.warm_profiler()
        if args.arm == "frozen":
            freeze_startup_heap()
        else:
            gc.collect()  # the same collection of start-up garbage, without the freeze
        tracked, frozen = len(gc.get_objects()), gc.get_freeze_count()
        # What a full collection costs this process when one comes (rare: see the docstring), timed directly.
        full_ms = []
        for _ in range(3):
            t0 = time.perf_counter()
            gc.collect()
            full_ms.append((time.perf_counter() - t0) * 1e3)
        pauses: list[tuple[int, float]] = []
        started: list[float] = [0.0]

        def timer(phase: str, info: dict) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                pauses.append((info["generation"], time.perf_counter() - started[0]))

        gc.callbacks.append(timer)
        n, steps = 0, []

        def add() -> None:
            nonlocal n
            prompt = "measure the pause " * (1 + n % 7)
            engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True))
            n += 1

        for _ in range(args.concurrency):
            add()
        end = time.perf_counter() + args.seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            out = engine.step()
            steps.append(time.perf_counter() - t0)
            for rid in out.finished:
                engine.release(rid)
                add()
        gc.callbacks.remove(timer)
    finally:
        probe.close()
    full = [s for g, s in pauses if g == 2]
    minutes = sum(steps) / 60
    steps.sort()
    return {"arm": args.arm, "tracked_at_start": tracked, "frozen_at_start": frozen,
            "forced_full_collection_ms": round(statistics.median(full_ms), 2), "requests": n,
            "steps": len(steps), "full_collections": len(full),
            "full_pause_ms_median": round(statistics.median(full) * 1e3, 2) if full else None,
            "full_pause_ms_max": round(max(full) * 1e3, 2) if full else None,
            "pause_s_per_min": {g: round(sum(s for gg, s in pauses if gg == g) / minutes, 4) for g in (0, 1, 2)},
            "step_ms_p50": round(steps[len(steps) // 2] * 1e3, 3),
            "step_ms_p99": round(steps[int(len(steps) * 0.99)] * 1e3, 3), "step_ms_max": round(steps[-1] * 1e3, 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-moe")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seconds", type=float, default=60.0, help="stepping per arm and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # one arm, in this process (the child)
    p.add_argument("--json", action="store_true", help="one JSON line last")
    args = p.parse_args()
    if args.arm:
        print(json.dumps(_one_arm(args)))
        return 0
    rows = []
    for rnd in range(args.rounds):
        for arm in (ARMS if rnd % 2 == 0 else ARMS[::-1]):
            child = [sys.executable, __file__, "--arm", arm, "--model", args.model, "--device", args.device,
                     "--seconds", str(args.seconds), "--concurrency", str(args.concurrency),
                     "--max-tokens", str(args.max_tokens)]
            out = subprocess.run(child, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"startup_heap_pauses: the {arm} arm failed: {out.stderr.strip().splitlines()[-1:]}",
                      file=sys.stderr)
                return 1
            rows.append({"round": rnd, **json.loads(out.stdout.strip().splitlines()[-1])})
            r = rows[-1]
            print(f"round {rnd} {arm:7s} tracked {r['tracked_at_start']:>7,} frozen {r['frozen_at_start']:>7,} a forced full collection {r['forced_full_collection_ms']} ms; full collections {r['full_collections']:>3} "
                  f"median {r['full_pause_ms_median']} ms max {r['full_pause_ms_max']} ms; pauses s/min "
                  f"{r['pause_s_per_min']}; step ms p50 {r['step_ms_p50']} p99 {r['step_ms_p99']} max {r['step_ms_max']}",
                  flush=True)
    if args.json:
        print(json.dumps({"measured": True, "how": __doc__.split("\n\n")[2].replace("\n", " "), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
