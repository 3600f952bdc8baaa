"""The probe observer's CPU time per decode step, measured directly (no GPU needed).

    python3 benchmarks/observer_cost.py [--batch 32] [--steps 3000]

Calls the ProbeObserver exactly as Engine.step does in a steady decode step (on_step_begin, one
on_tokens_emitted per sequence, on_step_end with the batch) and times the calls with
perf_counter_ns around the whole step's callbacks; a no-op EngineObserver timed the same way gives
the harness's own cost. A reader drains the ring every 64 steps, as the sidecar would, so writes
never fall into the ring's drop path. Prints medians and p99 in microseconds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import os
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infersight.probes.config import ProbeConfig  # noqa: E402
from infersight.probes.observer import ProbeObserver  # noqa: E402
from infersight.runtime.observer import EngineObserver  # noqa: E402
from infersight.runtime.stats import StepStats  # noqa: E402


def step_cost(observer: EngineObserver, batch: int, steps: int, drain) -> list[float]:
    ids = list(range(batch))
    for rid in ids:
        observer.on_request_arrived(rid, time.monotonic_ns(), 100, None, rid + 1)
    times = []
    clock = time.perf_counter_ns
    for step in range(1, steps + 1):
        stats = StepStats(step, 0, 0, num_decode_tokens=batch, batch=[(rid, 1) for rid in ids],
                          context_lens=[100 + step] * batch, phase="decode")
        t0 = clock()
        observer.on_step_begin(step, t0)
        now = time.monotonic_ns()
        for rid in ids:
            observer.on_tokens_emitted(rid, now, 1)
        observer.on_step_end(stats)
        times.append((clock() - t0) / 1e3)
        if step % 64 == 0:
            drain()
    return times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3000)
    args = ap.parse_args()
    from infersight.probes.ring import RingConsumer

    probe = ProbeObserver(ProbeConfig(nvtx=False, record_function=False, expert_counts=False,
                                      ring_name=f"obs-cost-{os.getpid()}", ring_capacity=1 << 16))
    consumer = RingConsumer.attach(probe.ring_name)
    try:
        base = step_cost(EngineObserver(), args.batch, args.steps, lambda: None)
        cost = step_cost(probe, args.batch, args.steps, lambda: consumer.read())
    finally:
        consumer.close()
        probe.close()
    for name, t in (("no-op observer (harness)", base), ("ProbeObserver", cost)):
        warm = sorted(t[len(t) // 10:])
        print(f"{name:26} batch {args.batch}: median {statistics.median(warm):6.2f} us/step, "
              f"p99 {warm[int(0.99 * len(warm))]:6.2f} us/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
