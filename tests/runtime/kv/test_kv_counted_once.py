"""Counters that cannot double count, on tiny pools (4 blocks of 4 tokens) with every count derived by
hand: a prefix hit is counted once per admitted request, not at every scheduling attempt (vLLM
#43736) nor again when a preempted request is re-admitted (vLLM #25780); tokens recomputed after a
preemption are not hits; an EVICTED event names the request whose allocation caused it.

The engine runs with the real probes; the ring is read back and folded by AgentState, the way the
agent does, so the counts checked are the ones /metrics would serve.
"""
from __future__ import annotations

import pandas as pd
from testkit import one_torch_thread, unique_ring

from infersight.agent.config import AgentConfig
from infersight.agent.state import AgentState
from infersight.correlate.frames import EventFrames, update_labels
from infersight.exporters import catalogue as C
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import Engine, EngineConfig, ModelConfig, SamplingParams

BOS = 256
MODEL = ModelConfig("kv-once", d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=16)


class Run:
    """An engine of 4 blocks of 4 positions (max_seq_len 16: the smallest pool allowed), no CPU tier,
    observed by the probes; steps() runs it and returns what the agent folded."""

    def __init__(self) -> None:
        self.ring = unique_ring("kvonce")
        self.probe = ProbeObserver(ProbeConfig(ring_name=self.ring, nvtx=False))
        self.consumer = RingConsumer.attach(self.ring, record_registry())
        self.engine = Engine(EngineConfig(model=MODEL, block_size=4, num_kv_blocks=4, cpu_offload_blocks=0, seed=1),
                             self.probe)
        self.frames = EventFrames()

    def add(self, prompt: list[int], max_tokens: int) -> int:
        return self.engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))

    def step(self, n: int | None = None) -> None:
        with one_torch_thread():
            while (n is None and self.engine.has_unfinished()) or (n is not None and n > 0):
                self.engine.step()
                n = None if n is None else n - 1

    def state(self) -> AgentState:
        records = self.consumer.read()
        assert self.consumer.dropped_seen == 0
        self.frames = self.frames.concat(EventFrames.from_records(records, update_labels({}, records)))
        state = AgentState(AgentConfig(rings=[self.ring]))
        state.ingest(self.frames)
        return state

    def kv(self, event: str) -> list[tuple[int, int]]:
        """(block_id, request_id) of every `event` KV record, in order."""
        ev = self.frames.kv_events
        return list(ev.loc[ev["event"] == event, ["block_id", "request_id"]].itertuples(index=False, name=None))

    def close(self) -> None:
        self.consumer.close()
        self.probe.close()


def counts(state: AgentState) -> dict[str, float]:
    kv_events = state.counters[C.KV_EVENTS.name]
    return {"hit_tokens": state.counters[C.PREFIX_HIT.name].total(),
            "queried_tokens": state.counters[C.PREFIX_QUERIED.name].total(),
            "hit_requests": state.counters[C.PREFIX_HIT_REQUESTS.name].total(),
            "requests": state.counters[C.PREFIX_REQUESTS.name].total(),
            "prefix_hit_events": kv_events.get(("prefix_hit",)), "resume_hit_events": kv_events.get(("resume_hit",)),
            "recomputed_tokens": state.counters[C.KV_RECOMPUTED_TOKENS.name].total()}


def test_a_request_that_waits_for_blocks_is_counted_once() -> None:
    # A = [BOS,1,2,3 | 5,6,7,8 | 9] (9 tokens, 3 tokens out) takes blocks 0, 1, 2 in step 1 and
    # registers blocks 0 and 1. B = [BOS,1,2,3 | 4,4,4,4 | 4] arrives after: its first block hits A's
    # block 0, but it needs 2 more blocks and 1 is free. Steps 2 and 3 look it up and fail (A finishes
    # in step 3, after scheduling); step 4 admits it: hit on 0 (now cached), 2 new blocks.
    run = Run()
    try:
        a = run.add([BOS, 1, 2, 3, 5, 6, 7, 8, 9], 3)
        run.step(1)
        b = run.add([BOS, 1, 2, 3, 4, 4, 4, 4, 4], 2)
        run.step(2)
        assert run.engine.requests[b].times.first_scheduled_ns is None  # two failed attempts so far
        run.step()
        state = run.state()
        assert counts(state) == {"hit_tokens": 4, "queried_tokens": 18, "hit_requests": 1, "requests": 2,
                                 "prefix_hit_events": 1, "resume_hit_events": 0, "recomputed_tokens": 0}
        assert run.kv("prefix_hit") == [(0, b)]
        assert run.engine.get_output(b).num_cached_tokens == 4 and run.engine.get_output(a).num_cached_tokens == 0
    finally:
        run.close()


def test_a_readmitted_request_is_not_a_second_hit_and_recomputed_tokens_are_not_hits() -> None:
    # S = [BOS,1,2,3 | 7], 1 token out: registers block 0, releases it (1 FREED, 0 CACHED).
    # Then r0 = [BOS,5,5,5 | 5] and r1 = [BOS,1,2,3 | 9], 6 tokens out each, arrive together.
    # Step 1 of theirs: r0 takes blocks 2, 3; r1 hits block 0 (a real prefix hit: 4 tokens) and takes 1.
    # Three decode steps fill positions 5-7: blocks 3 and 1 are full and registered.
    # Next step r0 needs a 3rd block for position 8: none free, so the newest, r1, is preempted
    # (recompute): its blocks are released tail-first (1, 0 CACHED) and r0's allocation evicts the
    # least recently freed, block 1: EVICTED (1, r0). r0 finishes two steps later, releasing 2, 3, 1.
    # r1 comes back with 9 tokens: block 0 is still cached (RESUME_HIT, not a prefix hit), its second
    # block was evicted, so 2 blocks are allocated and positions 4-8 recomputed; the second block's
    # content had been evicted: one RECOMPUTED block = 4 tokens, none of them a hit.
    run = Run()
    try:
        s = run.add([BOS, 1, 2, 3, 7], 1)
        run.step()
        r0 = run.add([BOS, 5, 5, 5, 5], 6)
        r1 = run.add([BOS, 1, 2, 3, 9], 6)
        run.step()
        state = run.state()
        assert [r for _, r in run.engine.requests[r1].times.preemptions] == ["recompute"]
        assert run.engine.requests[r0].num_preemptions == 0
        # Hits: r1's 4 tokens, once. Queried: 5 + 5 + 5 prompt tokens.
        assert counts(state) == {"hit_tokens": 4, "queried_tokens": 15, "hit_requests": 1, "requests": 3,
                                 "prefix_hit_events": 1, "resume_hit_events": 1, "recomputed_tokens": 4}
        assert run.kv("prefix_hit") == [(0, r1)] and run.kv("resume_hit") == [(0, r1)]
        # Evictions: r0's allocation dropped r1's block 1; on its return r1 takes block 1 (free, uncached)
        # and evicts the oldest cached block, 3 (r0's, freed after 0): each names its allocator.
        assert run.kv("evicted") == [(1, r0), (3, r1)]
        assert run.kv("recomputed") == [(1, r1)]  # r1's second block, refilled in block 1
        assert run.engine.get_output(r1).num_cached_tokens == 4 and run.engine.get_output(s).num_cached_tokens == 0
        # The row of every request carries its first admission's cached tokens, once.
        rows = pd.DataFrame(list(state.finished)).set_index("request_id")
        assert rows.loc[[s, r0, r1], "cached_tokens"].tolist() == [0, 0, 4]
    finally:
        run.close()
