"""Slow-request scenarios built on purpose with the real engine, each with several victims whose cause
is known before anything runs: long prompts among short ones, queues behind long answers, a pool too
small (recompute, and swap to the CPU tier), prefill chunks beside decodes, creative text under
speculation (the shipped models), responses held up in the network, and a garbage collection of the
engine's process while requests are in flight.

The rules. long_prompt runs under the agent's defaults (AgentConfig(): the e2e p99 of the last 1,000
requests, judged from the 20th on). The p99 rule flags at most 1% of the window, and on a loaded host
the jitter of the normal requests takes whatever share of that 1% is free; each of its victims is
therefore the 100k+1-th request to finish, where the budget grows by one (its room never depends on
how many normal requests the host made slow). The others run under an SLO on the metric their cause
slows, e2e (ITL for prefill beside decodes), set at SLO_FACTOR times the median of their normal
requests by the engine's own timestamps, so that every victim is judged however many there are.
Every victim is built to be far slower than that: SLO_FACTOR sits well below the slowdown each
scenario builds and well above the jitter of a loaded 2-core host.
"""
from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from slow_scenario_kit import Driver, Outcome, tokens

from infersight.correlate.frames import SERVED_COLUMNS, EventFrames
from infersight.runtime import EngineConfig, ModelConfig
from infersight.runtime.model.weights import shipped_weights
from infersight.workload import WorkloadConfig, build_workload

TINY = ModelConfig("slow-t", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=512)
LONG = ModelConfig("slow-long", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=2048)
WIDE = ModelConfig("slow-wide", d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=512, max_seq_len=1024)
#: The SLO of the SLO scenarios, as a multiple of their normal requests' median.
SLO_FACTOR = 2.0


def _e2e_s(d: Driver) -> Callable[[int], float]:
    """A request's e2e by the engine's timestamps (arrival to finish), seconds."""
    def e2e(rid: int) -> float:
        times = d.engine.get_output(rid).times
        return (times.finish_ns - times.arrival_ns) / 1e9
    return e2e


def _itl_s(d: Driver) -> Callable[[int], float]:
    """A request's mean inter-token latency by the engine's timestamps, seconds."""
    def itl(rid: int) -> float:
        out = d.engine.get_output(rid)
        return (out.times.finish_ns - out.times.first_token_ns) / max(1, len(out.token_ids) - 1) / 1e9
    return itl


def _slowdowns(d: Driver, normal: list[int], value: Callable[[int], float]) -> tuple[float, dict[int, float]]:
    """The normal requests' median of `value`, and each victim's value over it."""
    typical = float(np.median([value(r) for r in normal]))
    return typical, {r: value(r) / typical for r in d.victims}


def _judge_over_slo(d: Driver, normal: list[int], metric: str, value: Callable[[int], float],
                    **frames: EventFrames) -> Outcome:
    """Judge under an SLO on `metric` (e2e or itl) at SLO_FACTOR x the normal requests' median of
    `value` (the same metric by the engine's timestamps); frames: Driver.judge's first / last."""
    typical, slowdown = _slowdowns(d, normal, value)
    rule = {f"slo_{metric}_s": SLO_FACTOR * typical}
    return replace(d.judge(**frames, **rule), slowdown=slowdown)  # type: ignore[arg-type]


def long_prompt() -> Outcome:
    """Five prompts of 2,000 tokens among 496 short requests, each alone, prefilled 16 a step (129 steps
    with their 4 tokens out, where a normal request in its group of 20 is done in 5 to 10), under the
    agent's default rule."""
    d = Driver(EngineConfig(model=LONG, block_size=16, num_kv_blocks=136, max_num_batched_tokens=16), every=64)
    normal = []
    for k in range(1, 6):
        # 100 requests before the first, 99 between the next ones: victim k is request 100k, the
        # (100k+1)-th to finish (each group runs until idle). As it finishes, the window passes 100k
        # requests: the budget (ceil(1% of the window)) becomes k+1, where the older flags, capped by
        # the budget of their time, hold at most k; and the p99 lies below the k largest e2e. So it
        # is flagged however many normal requests the host's jitter flagged before it, as long as no
        # normal request was stalled past it (it takes about 20x their median).
        normal += d.normal(100 if k == 1 else 99, max_tokens=4, at_once=20)
        victim = d.add(tokens(2000, first=37 * k), 4, victim_of="long_prompt")
        assert victim == 100 * k
        d.run()
    return replace(d.judge(), slowdown=_slowdowns(d, normal, _e2e_s(d))[1])


def queue_behind_long_answers() -> Outcome:
    """Two seats (max_num_seqs=2). Three times: two long answers (64 tokens, eight times a normal
    one) take both seats, then four normal requests arrive and wait for them (64 steps where a
    normal request takes 9), then for each other."""
    d = Driver(EngineConfig(model=TINY, block_size=8, num_kv_blocks=128, max_num_seqs=2), every=64)
    normal = d.normal(20, max_tokens=8)
    for k in range(3):
        for i in range(2):
            d.add(f"a long answer {k} {i}", 64, victim_of="long_output")
        d.run(2)
        for i in range(4):
            d.add(f"a queued request {k} {i}", 8, victim_of="queue_wait")
        d.run()
        normal += d.normal(6, max_tokens=8)
    return _judge_over_slo(d, normal, "e2e", _e2e_s(d))


def small_pool(cpu_offload_blocks: int) -> Outcome:
    """A pool of 16 blocks of 8 (128 positions). Five times: a long answer (8 + 115 positions: the
    whole pool) runs alone until it holds 10 blocks, then a normal-sized request (40 prompt tokens,
    8 out: 6 blocks) joins; when the long one needs its 11th block, the newest, the joiner, is
    preempted and waits about 42 steps for the long one to finish, where a normal request takes 9."""
    d = Driver(EngineConfig(model=TINY, block_size=8, num_kv_blocks=16, cpu_offload_blocks=cpu_offload_blocks,
                            max_model_len=128), every=64)
    cause = "kv_reload" if cpu_offload_blocks else "preemption"
    prompt = lambda rid: tokens(40, first=rid)  # noqa: E731  (distinct from the first block: no prefix hits)
    normal = d.normal(20, max_tokens=8, prompt=prompt)
    for k in range(5):
        d.add(tokens(8, first=200 + k), 115, victim_of="long_output")
        d.run(1 + 68)  # its prefill, then 68 tokens: 76 positions, 10 blocks
        d.add(tokens(40, first=100 + 7 * k), 8, victim_of=cause)
        d.run()
        normal += d.normal(4, max_tokens=8, prompt=prompt)
    preempted = sorted(r for r, req in d.engine.requests.items() if req.num_preemptions)
    assert preempted == sorted(r for r, c in d.victims.items() if c == cause), "must preempt exactly the joiners"
    return _judge_over_slo(d, normal, "e2e", _e2e_s(d))


def prefill_beside_decode() -> Outcome:
    """A wider model, so that a 512-token prefill chunk costs many decode steps even on a busy
    machine. Three times: two requests decode (8 tokens) while 2,000 prompt tokens of two
    prompt-only requests are prefilled 511 a step beside them; judged under an ITL SLO (the
    prompt-only requests have no ITL)."""
    d = Driver(EngineConfig(model=WIDE, block_size=16, num_kv_blocks=256, max_num_batched_tokens=512), every=64)
    normal = d.normal(12, max_tokens=8)
    for k in range(3):
        for i in range(2):
            d.add(f"a request decoding {k} {i}", 8, victim_of="batch_interference")
        d.run(2)
        for i in range(2):
            d.add(tokens(1000, first=60 * k + 20 * i), 1)
        d.run()
        normal += d.normal(4, max_tokens=8)
    return _judge_over_slo(d, normal, "itl", _itl_s(d))


def creative_under_speculation() -> Outcome:
    """The shipped models: tiny-draft guesses json well and creative text hardly at all (acceptance
    0.67 against 0.04, infersight/models/README.md), so a creative request gets about one token per
    verification where a json one gets three or more. Eighteen json requests (64 tokens) and six
    creative ones (16 tokens, so that they run beside the json ones, in the same steps, to their
    end) arrive together; judged under an ITL SLO."""
    assert shipped_weights("tiny-moe") is not None and shipped_weights("tiny-draft") is not None, \
        "the trained models are not in infersight/models"
    d = Driver(EngineConfig(model="tiny-moe", speculative_model="tiny-draft", num_speculative_tokens=4), every=64)
    workload = build_workload(WorkloadConfig(num_requests=100, max_tokens=64, seed=0))
    json = [r for r in workload if r.task == "json" and len(r.prompt) < 200][:18]
    creative = [r for r in workload if r.task == "creative" and len(r.prompt) < 200][:6]
    normal = [d.add(r.prompt, 64, task=r.task) for r in json]
    for r in creative:
        d.add(r.prompt, 16, task="creative", victim_of="speculation_rejections")
    d.run()
    return _judge_over_slo(d, normal, "itl", _itl_s(d))


def slow_network() -> Outcome:
    """Served requests (SERVED and NETWORK records as `infersight serve` writes them): the body
    received 1 ms before the engine's arrival, the last byte 1 ms after the finish, except for six
    slow readers: 2 s after (written, not waited for: far above a loaded host's stalls)."""
    d = Driver(EngineConfig(model=TINY, block_size=8, num_kv_blocks=64), every=64)
    ids = d.normal(24)
    for k in range(6):
        ids.append(d.add(f"served to a slow reader {k}", 16, victim_of="network"))
        d.run()
        ids += d.normal(4)
    times = {r: d.engine.get_output(r).times for r in ids}
    served = pd.DataFrame({c: [0] * len(ids) for c in SERVED_COLUMNS}).astype(SERVED_COLUMNS)
    served["request_id"] = ids
    delay_ms = {r: 2000 if r in d.victims else 1 for r in ids}
    network = pd.DataFrame({"request_id": ids, "receive_ns": [times[r].arrival_ns - 1_000_000 for r in ids],
                            "first_byte_ns": [times[r].finish_ns for r in ids],
                            "last_byte_ns": [times[r].finish_ns + delay_ms[r] * 1_000_000 for r in ids]})
    # The served e2e: from the body received to the last byte out.
    served_e2e = dict(zip(ids, (network["last_byte_ns"] - network["receive_ns"]).to_numpy() / 1e9))
    normal = [r for r in ids if r not in d.victims]
    # SERVED at arrival (the agent holds the rows until their NETWORK record, in the last poll).
    return _judge_over_slo(d, normal, "e2e", served_e2e.__getitem__, first=EventFrames(served=served),
                           last=EventFrames(network=network))


def host_pause() -> Outcome:
    """Five times: two requests (8 tokens, as the normal ones) are prefilled and decode two tokens, then
    the engine's process runs a full garbage collection over a live heap built for it (300,000 lists of
    50 references: 0.15-0.19 s on an idle host, where a normal request takes a few ms), then they finish.
    The collection is a real one of this process, called between two steps as one that the engine's own
    allocations set off would run; only the probes' gc.callbacks see it. Normal requests run before and
    after each, never beside it."""
    d = Driver(EngineConfig(model=TINY, block_size=8, num_kv_blocks=64), every=64)
    normal = d.normal(20, max_tokens=8)
    heap = [[0] * 50 for _ in range(300_000)]  # what the collector walks (tracked, alive: nothing freed)
    for k in range(5):
        for i in range(2):
            d.add(f"in flight through a collection {k} {i}", 8, victim_of="host_pause")
        d.run(3)
        gc.collect()
        d.run()
        normal += d.normal(4, max_tokens=8)
    del heap
    return _judge_over_slo(d, normal, "e2e", _e2e_s(d))


SCENARIOS: dict[str, Callable[[], Outcome]] = {
    "long_prompt": long_prompt, "queue": queue_behind_long_answers, "recompute": lambda: small_pool(0),
    "swap": lambda: small_pool(16), "interference": prefill_beside_decode,
    "speculation": creative_under_speculation, "network": slow_network, "host_pause": host_pause}
