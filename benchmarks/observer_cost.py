"""The probe observer's CPU time per decode step, measured directly (no GPU needed).

    taskset -c 1 python3 benchmarks/observer_cost.py [--batch 32] [--steps 3000]
    taskset -c 1 python3 benchmarks/observer_cost.py --against DIR [--rounds 5]

Calls the ProbeObserver exactly as Engine.step does in a steady decode step (on_step_begin, one
on_tokens_emitted_many for the batch's tokens, on_step_end with the batch; a tree from before that
callback: one on_tokens_emitted per sequence, as its engine did) and times the calls with
perf_counter_ns around the whole step's callbacks; a no-op EngineObserver timed the same way gives
the harness's own cost. A reader drains the ring every 64 steps, as the sidecar would, so writes
never fall into the ring's drop path. Untimed steps first fill the ring once: a running engine's
ring has wrapped, and on the first lap each new 4 KiB of slots is a page fault (about one per
batch-32 step with batched records), which would be timed otherwise. Prints medians and p99 in
microseconds.

``--against DIR`` (another checkout's root, e.g. ``git worktree add /tmp/before HEAD``) measures
before / after / after again in separate processes, interleaved in rotating order for ``--rounds``
rounds (the CPU affinity is inherited): the after-vs-after pair is the A/A noise floor. Each runs
this script, importing infersight from its tree (OBSERVER_COST_CODE), so both get the same harness.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.environ.get("OBSERVER_COST_CODE") or _HERE)  # the tree under test (see --against)
from infersight.probes.config import ProbeConfig  # noqa: E402
from infersight.probes.observer import ProbeObserver  # noqa: E402
from infersight.runtime.observer import EngineObserver  # noqa: E402
from infersight.runtime.stats import StepStats  # noqa: E402

_MEDIAN = re.compile(r"^(no-op observer \(harness\)|ProbeObserver)\s+batch \d+: median\s+([\d.]+)", re.M)


def step_cost(observer: EngineObserver, batch: int, steps: int, drain, first: int = 1) -> list[float]:
    ids = list(range(batch))
    for rid in ids:
        observer.on_request_arrived(rid, time.monotonic_ns(), 100, None, rid + 1)
    times = []
    clock = time.perf_counter_ns
    many = getattr(observer, "on_tokens_emitted_many", None)
    for step in range(first, first + steps):
        stats = StepStats(step, 0, 0, num_decode_tokens=batch, batch=[(rid, 1) for rid in ids],
                          context_lens=[100 + step] * batch, phase="decode")
        rids, counts = list(ids), [1] * batch  # new lists each step, as the engine hands over
        t0 = clock()
        observer.on_step_begin(step, t0)
        now = time.monotonic_ns()
        if many is not None:
            many(rids, now, counts)
        else:  # a tree from before the batched callback: its engine called once per sequence
            for rid in ids:
                observer.on_tokens_emitted(rid, now, 1)
        observer.on_step_end(stats)
        times.append((clock() - t0) / 1e3)
        if step % 64 == 0:
            drain()
    return times


def measure(batch: int, steps: int) -> int:
    from infersight.probes.ring import RingConsumer

    probe = ProbeObserver(ProbeConfig(nvtx=False, record_function=False, expert_counts=False,
                                      ring_name=f"obs-cost-{os.getpid()}", ring_capacity=1 << 16))
    consumer = RingConsumer.attach(probe.ring_name)
    try:
        base = step_cost(EngineObserver(), batch, steps, lambda: None)
        first = 1
        while probe.ring.stats()["written"] < probe.ring.header.capacity:  # the ring's first lap, untimed
            step_cost(probe, batch, 1024, lambda: consumer.read(), first)
            first += 1024
        cost = step_cost(probe, batch, steps, lambda: consumer.read(), first)
    finally:
        consumer.close()
        probe.close()
    for name, t in (("no-op observer (harness)", base), ("ProbeObserver", cost)):
        warm = sorted(t[len(t) // 10:])
        print(f"{name:26} batch {batch}: median {statistics.median(warm):6.2f} us/step, "
              f"p99 {warm[int(0.99 * len(warm))]:6.2f} us/step")
    return 0


def _run(code: str, batch: int, steps: int) -> tuple[float, float]:
    """(harness, ProbeObserver) medians in us/step from one run of this script on the tree `code`."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--batch", str(batch), "--steps", str(steps)],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "OBSERVER_COST_CODE": code}).stdout
    found = dict(_MEDIAN.findall(out))
    return float(found["no-op observer (harness)"]), float(found["ProbeObserver"])


def compare(against: str, batch: int, steps: int, rounds: int) -> int:
    if not os.path.isfile(os.path.join(against, "infersight", "probes", "observer.py")):
        print(f"observer_cost: no infersight/probes/observer.py under {against}", file=sys.stderr)
        return 2
    scripts = {"before": os.path.abspath(against), "after": _HERE, "after again": _HERE}
    names = list(scripts)
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % 3:] + names[:r % 3]  # rotate, so no variant always runs first
        for name in order:
            got[name].append(_run(scripts[name], batch, steps))
        print(f"round {r + 1}: " + ", ".join(f"{n} {got[n][-1][1]:.2f}" for n in names) + " us/step", flush=True)
    med = {n: statistics.median(v[1] for v in got[n]) for n in names}
    harness = statistics.median(h for n in names for h, _ in got[n])
    aa = [abs(a[1] / b[1] - 1) for a, b in zip(got["after"], got["after again"])]
    print(f"batch {batch}, {steps} steps x {rounds} rounds, medians of per-run medians (us/step):")
    print(f"  before {med['before']:.2f}   after {med['after']:.2f}   after again {med['after again']:.2f}   "
          f"harness (no-op observer) {harness:.2f}")
    print(f"  after / before {med['after'] / med['before']:.3f};  A/A |after / after again - 1|: median "
          f"{100 * statistics.median(aa):.1f}%, max {100 * max(aa):.1f}%")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--against", help="another checkout's root: measure it (before) and this tree (after)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.batch < 1 or args.steps < 20 or args.rounds < 1:
        print("observer_cost: --batch >= 1, --steps >= 20 and --rounds >= 1", file=sys.stderr)
        return 2
    if args.against:
        return compare(args.against, args.batch, args.steps, args.rounds)
    return measure(args.batch, args.steps)


if __name__ == "__main__":
    sys.exit(main())
