"""What the probes cost a fast engine's decode step, with the noise floor of the method itself.

One engine, one process, one steady decode batch. A `SwitchObserver` picks what observes the
engine between blocks of `--block-steps` decode steps: `off` (no probes), `off2` (no probes again:
the A/A control), `nvtx` (ranges only) and `all` (NVTX + semantic records into the ring, drained
between blocks outside the timing). Each round runs one block of every variant, in an order that
rotates from round to round, so each variant sits in each position equally and a slow drift of
the machine (or the context growing) hits all alike. A block's time is the wall time of its steps
between two device syncs (what the probes add is host time, so the wall clock is the right clock).

Reported per variant: the median over rounds of (its block / the `off` block of the same round),
and for that paired ratio its standard error (1.4826 x MAD / sqrt(rounds)). `timed` is `all` with
each callback's wall time summed in place (its own ring; the timing adds ~0.1 µs per callback):
the probes' host time per step, measured directly. The A/A ratio
`off2 / off` and its standard error are the method's noise floor: a ratio within a few standard
errors of 1 is not told apart from the machine's jitter.

Requests never finish inside a timed round: each batch "life" decodes `--rounds-per-life` rounds,
then is aborted and replaced (its prefill untimed), so every timed step is a full-batch decode step.

    # H200 (issue 16): llama-1b-shape, bf16, CUDA graphs on
    python benchmarks/probe_cost.py --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 \
        --context 512 --block-steps 16 --rounds 60
    # CPU smoke run
    python benchmarks/probe_cost.py --model tiny-moe --batch 2 --context 16 --block-steps 2 --rounds 4

Prints one line per variant, then one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from infersight.bench.engine.switch import SwitchObserver
from infersight.bench.engine.timing import sync
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver, make_observer
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import Engine, EngineConfig, SamplingParams

VARIANTS = ("off", "off2", "nvtx", "all", "timed")
CALLBACKS = ("on_request_arrived", "on_request_scheduled", "on_prefill_chunk", "on_first_token", "on_tokens_emitted",
             "on_tokens_emitted_many",
             "on_request_preempted", "on_request_resumed", "on_request_finished", "on_kv_block", "on_expert_counts",
             "on_spec_verified", "on_step_begin", "on_step_end")


class CallbackClock:
    """Wall time spent inside one observer's callbacks (its instance methods replaced by timed ones):
    the probes' host time measured in place, to set beside what the blocks' step times say."""

    def __init__(self, observer: ProbeObserver) -> None:
        self.ns = 0
        for name in CALLBACKS:
            setattr(observer, name, self._timed(getattr(observer, name)))

    def _timed(self, fn):  # noqa: ANN001, ANN202 -- any callback's signature
        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns += time.perf_counter_ns() - t0
        return timed


@dataclass
class BlockLog:
    """Every timed block: times_ns[variant][round], and the records the `all` blocks wrote."""

    times_ns: dict[str, list[int]] = field(default_factory=lambda: {v: [] for v in VARIANTS})
    records_all: int = 0
    steps_all: int = 0
    gc_runs: dict[str, int] = field(default_factory=lambda: {v: 0 for v in (*VARIANTS, "between")})
    callback_ns: list[int] = field(default_factory=list)  # per `timed` block: ns inside the callbacks
    not_full: int = 0  # timed steps that were not a full-batch decode step (should stay 0)


def paired_ratio(times: list[int], base: list[int]) -> tuple[float, float]:
    """Median over rounds of times[r] / base[r], and its standard error (1.4826 x MAD / sqrt(n))."""
    ratios = [t / b for t, b in zip(times, base, strict=True)]
    med = statistics.median(ratios)
    mad = statistics.median([abs(r - med) for r in ratios])
    return med, 1.4826 * mad / len(ratios) ** 0.5


def round_order(r: int) -> list[str]:
    """The variants rotated by the round number: each takes each position equally often."""
    k = r % len(VARIANTS)
    return list(VARIANTS[k:] + VARIANTS[:k])


class Batch:
    """`batch` requests of `context` distinct prompt tokens, decoding until aborted."""

    def __init__(self, engine: Engine, batch: int, context: int, max_tokens: int, life: int,
                 temperature: float = 0.0) -> None:
        self.engine, self.batch = engine, batch
        gen = torch.Generator().manual_seed(life)
        vocab = engine.config.model_config.vocab_size
        self.ids = [engine.add_request(torch.randint(3, vocab, (context,), generator=gen).tolist(),
                                       SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True,
                                                      seed=life * batch + i))
                    for i in range(batch)]
        while True:  # prefill (chunked or not) until every request decodes: untimed
            stats = engine.step()
            if stats.phase == "decode" and stats.num_decode_tokens == batch:
                break

    def close(self) -> None:
        for rid in self.ids:
            self.engine.abort_request(rid)
        while self.engine.has_unfinished():
            self.engine.step()
        for rid in self.ids:
            self.engine.release(rid)


def run(args: argparse.Namespace) -> dict[str, object]:
    ring = f"infersight-probecost-{os.getpid()}-{time.monotonic_ns()}"
    probe = ProbeObserver(ProbeConfig(ring_name=ring))
    timed = ProbeObserver(ProbeConfig(ring_name=ring + "-timed"))
    clock = CallbackClock(timed)
    switch = SwitchObserver({"off": make_observer(None), "off2": make_observer(None),
                             "nvtx": make_observer(ProbeConfig(events=False)), "all": probe, "timed": timed},
                            initial="all")
    life_steps = args.rounds_per_life * len(VARIANTS) * args.block_steps
    max_len = args.context + life_steps + args.warmup_steps + 16
    # KV for the whole batch at its longest (16-token blocks): a preemption would change the batch mid-block.
    engine = Engine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype, max_num_seqs=args.batch,
                                 max_num_batched_tokens=max(512, args.batch * args.context),
                                 max_model_len=max_len, num_kv_blocks=args.batch * -(-max_len // 16) + 16,
                                 enable_prefix_caching=False, async_scheduling=args.async_scheduling), switch)
    consumer = RingConsumer.attach(probe.ring_name, record_registry())
    timed_ring = RingConsumer.attach(timed.ring_name, record_registry())
    log = BlockLog()
    current = ["all"]

    def count_gc(phase: str, _info: dict) -> None:
        if phase == "start":
            log.gc_runs[current[0]] += 1

    gc.callbacks.append(count_gc)
    rounds_done, life = 0, 0
    try:
        while rounds_done < args.rounds:
            switch.select("all")  # the ProbeObserver sees every request arrive
            batch = Batch(engine, args.batch, args.context, life_steps + args.warmup_steps + 8, life, args.temperature)
            for _ in range(args.warmup_steps):  # graph replays, allocator, Triton: warm before timing
                engine.step()
            for _ in range(min(args.rounds_per_life, args.rounds - rounds_done)):
                for variant in round_order(rounds_done):
                    current[0] = variant
                    if variant == "timed":
                        before = clock.ns
                    _timed_block(engine, switch, consumer, variant, args, log)
                    current[0] = "between"
                    timed_ring.read()
                    if variant == "timed":
                        log.callback_ns.append(clock.ns - before)
                rounds_done += 1
            switch.select("all")
            batch.close()
            consumer.read()
            life += 1
        dropped = consumer.stats()["dropped"] + timed_ring.stats()["dropped"]
    finally:
        gc.callbacks.remove(count_gc)
        consumer.close()
        timed_ring.close()
        probe.close()
        timed.close()
    base = log.times_ns["off"]
    ratios = {v: paired_ratio(log.times_ns[v], base) for v in VARIANTS if v != "off"}
    step_ms = {v: statistics.median(log.times_ns[v]) / args.block_steps / 1e6 for v in VARIANTS}
    return {
        "model": args.model, "device": args.device, "dtype": args.dtype, "batch": args.batch,
        "context": args.context, "block_steps": args.block_steps, "rounds": args.rounds, "lives": life,
        "machine": platform.node(), "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "async_scheduling": args.async_scheduling, "temperature": args.temperature,
        "cuda_graphs": engine.target.graphs is not None, "graph_blocker": engine.target.graph_blocker,
        "step_ms": step_ms,
        "ratio": {v: r for v, (r, _) in ratios.items()}, "stderr": {v: e for v, (_, e) in ratios.items()},
        "noise_floor": max(abs(ratios["off2"][0] - 1.0), ratios["off2"][1]),
        "records_per_step_all": log.records_all / max(log.steps_all, 1), "dropped": dropped,
        "callback_us_per_step": statistics.median(log.callback_ns) / args.block_steps / 1e3,
        "all_minus_off_us_per_step": (step_ms["all"] - step_ms["off"]) * 1e3,
        "gc_runs": log.gc_runs,
        "not_full_steps": log.not_full, "times_ns": log.times_ns,
    }


def _timed_block(engine: Engine, switch: SwitchObserver, consumer: RingConsumer, variant: str,
                 args: argparse.Namespace, log: BlockLog) -> None:
    switch.select(variant)
    produced = consumer.stats()["produced"]
    sync(args.device)
    t0 = time.perf_counter_ns()
    full = 0
    for _ in range(args.block_steps):
        stats = engine.step()
        full += stats.phase == "decode" and stats.num_decode_tokens == args.batch
    sync(args.device)
    log.times_ns[variant].append(time.perf_counter_ns() - t0)
    log.not_full += args.block_steps - full
    consumer.read()
    if variant == "all":
        log.records_all += consumer.stats()["produced"] - produced
        log.steps_all += args.block_steps


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-moe")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--context", type=int, default=16)
    p.add_argument("--block-steps", type=int, default=16, help="decode steps per timed block")
    p.add_argument("--rounds", type=int, default=60, help="rounds of one block per variant")
    p.add_argument("--rounds-per-life", type=int, default=8, help="rounds before the batch is replaced")
    p.add_argument("--warmup-steps", type=int, default=8, help="untimed decode steps after each prefill")
    p.add_argument("--threads", type=int, default=0, help="CPU: torch threads (0: leave as is)")
    p.add_argument("--temperature", type=float, default=0.0, help="the batch's temperature (0: greedy)")
    p.add_argument("--async-scheduling", action="store_true",
                   help="EngineConfig.async_scheduling: the probes' host work overlaps the device's")
    args = p.parse_args(argv)
    if min(args.batch, args.context, args.block_steps, args.rounds, args.rounds_per_life) < 1 or args.warmup_steps < 0:
        print("probe_cost: --batch, --context, --block-steps, --rounds and --rounds-per-life must be >= 1",
              file=sys.stderr)
        raise SystemExit(2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    for v in VARIANTS:
        if v == "off":
            print(f"off   {result['step_ms']['off']:.4f} ms/step (the base)", file=sys.stderr)
            continue
        print(f"{v:<5} {result['step_ms'][v]:.4f} ms/step  ratio {result['ratio'][v]:.4f} "
              f"± {result['stderr'][v]:.4f} (paired, over {args.rounds} rounds)", file=sys.stderr)
    print(f"callbacks in place: {result['callback_us_per_step']:.1f} µs/step; all - off: "
          f"{result['all_minus_off_us_per_step']:.1f} µs/step; gc runs {result['gc_runs']}", file=sys.stderr)
    print(f"noise floor (A/A off2/off): {result['noise_floor']:.4%}; records/step (all): "
          f"{result['records_per_step_all']:.1f}; cuda graphs: {result['cuda_graphs']}", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
