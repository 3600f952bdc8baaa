"""KV block lifecycle through the Engine: exact event sequences on scripted scenarios (derived by
hand in the comments), then pool/table invariants under 1000 random requests with preemption.

Rules used in the derivations (from kv_pool / kv_cache / scheduler):
  * a fresh pool hands out ids 0, 1, 2, ...; FREED blocks go to the back of free_uncached, which is
    used before any cached block is evicted; cached free blocks are evicted least recently freed first;
  * release is tail-first; a block with a hash (full and computed) becomes CACHED, else FREED;
  * after a step, blocks [0, num_computed // block_size) are registered (hashed);
  * a request with prompt P and max_tokens M computes at most P + M - 1 positions (the last sampled
    token is never fed), so it holds ceil((P + M - 1) / block_size) blocks at the end.
"""

from __future__ import annotations

import random

import pytest
import torch

from infersight.runtime import Engine, EngineConfig, EngineObserver, KVBlockEvent, ModelConfig, SamplingParams
from infersight.runtime.engine.request import RequestStatus
from infersight.runtime.tokenizer import ByteTokenizer

E = KVBlockEvent
ALLOC, HIT, FREED, CACHED, EVICT = E.ALLOCATED, E.PREFIX_HIT, E.FREED, E.CACHED, E.EVICTED
OFFL, RELOAD, RECOMP, RESUME = E.OFFLOADED, E.RELOADED, E.RECOMPUTED, E.RESUME_HIT


def _model(max_seq_len: int = 64, name: str = "kv-test-tiny") -> ModelConfig:
    return ModelConfig(name, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=64,
                       max_seq_len=max_seq_len)


class Recorder(EngineObserver):
    """KV events as (event, block_id, request_id); preemptions as ("preempt", reason, request_id)."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.log: list[tuple[KVBlockEvent, int, int, int]] = []   # every KV event, with its hash
        self.preemptions: list[tuple[int, str]] = []

    def on_kv_block(self, event: KVBlockEvent, block_id: int, request_id: int, block_hash: int) -> None:
        self.events.append((event, block_id, request_id))
        self.log.append((event, block_id, request_id, block_hash))

    def on_request_preempted(self, request_id: int, t_ns: int, reason: str) -> None:
        self.events.append(("preempt", reason, request_id))
        self.preemptions.append((request_id, reason))

    def take(self) -> list[tuple]:
        out, self.events = self.events, []
        return out


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, ignore_eos=True, max_tokens=max_tokens)


def _run_alone(engine: Engine, prompt: list[int], max_tokens: int) -> int:
    rid = engine.add_request(prompt, _greedy(max_tokens))
    while engine.has_unfinished():
        engine.step()
    return rid


# ---------------------------------------------------------------- prefix hit, eviction, recompute


def test_prefix_hit_then_eviction_then_recompute_exact_events() -> None:
    bs = 4
    rec = Recorder()
    # 64 / 4 = 16 blocks: the smallest pool the config accepts.
    engine = Engine(EngineConfig(model=_model(64), block_size=bs, num_kv_blocks=16, seed=3), rec)
    pool = engine.kv.pool
    prompt = [256, 10, 11, 12, 13, 14, 15, 16, 17]           # 9 tokens = 2 full blocks + 1

    # A: prompt 9, max_tokens 3 -> computes 9 + 3 - 1 = 11 positions -> ceil(11/4) = 3 blocks,
    # fresh pool: 0, 1, 2 (all in the first step's prefill). Positions 0-7 fill blocks 0, 1
    # (registered); block 2 holds positions 8-10 only (never full). Release tail-first:
    # 2 FREED, 1 CACHED, 0 CACHED.  free_uncached [3..15, 2], free_cached [1, 0].
    a = _run_alone(engine, prompt, 3)
    assert rec.take() == [(ALLOC, 0, a), (ALLOC, 1, a), (ALLOC, 2, a),
                          (FREED, 2, a), (CACHED, 1, a), (CACHED, 0, a)]
    assert list(pool.free_cached) == [1, 0]

    # B: same prompt. Hits are capped at (9 - 1) // 4 = 2 blocks: A's 0 and 1. It needs
    # ceil(11/4) - 2 = 1 more: the head of free_uncached, 3. Release: 3 FREED, 1 CACHED, 0 CACHED.
    # free_uncached [4..15, 2, 3], free_cached [1, 0].
    b = _run_alone(engine, prompt, 3)
    assert rec.take() == [(HIT, 0, b), (HIT, 1, b), (ALLOC, 3, b),
                          (FREED, 3, b), (CACHED, 1, b), (CACHED, 0, b)]
    assert engine.get_output(b).num_cached_tokens == 8
    assert engine.get_output(a).num_cached_tokens == 0

    # C: an unrelated 57-token prompt, max_tokens 1 -> ceil(57/4) = 15 blocks: the 14 uncached
    # (4..15, 2, 3), then the least recently freed cached block, 1, is evicted. 57 // 4 = 14 full
    # blocks get registered (all but block 1, which holds position 56 only). Release tail-first:
    # 1 FREED, then 3, 2, 15, 14, ..., 4 CACHED.
    c_prompt = [100 + (i % 50) for i in range(57)]
    c = _run_alone(engine, c_prompt, 1)
    c_table = list(range(4, 16)) + [2, 3]
    assert rec.take() == ([(ALLOC, bid, c) for bid in c_table] + [(EVICT, 1, c), (ALLOC, 1, c)]
                          + [(FREED, 1, c)] + [(CACHED, bid, c) for bid in reversed(c_table)])
    # free_uncached [1], free_cached [0, 3, 2, 15, 14, ..., 4]

    # D: A's prompt again. Block 0 (A's first block) is still cached: hit. A's second block was
    # evicted: the hit chain stops. It needs ceil(9/4) - 1 = 2 blocks: 1 (uncached), then the
    # oldest cached block after 0 was taken, 3 (evicted). Its prefill fills block 1 with A's second
    # block content, whose hash was evicted: RECOMPUTED on block 1. Release: 3 FREED (position 8
    # only), 1 CACHED, 0 CACHED.
    d = _run_alone(engine, prompt, 1)
    assert rec.take() == [(HIT, 0, d), (ALLOC, 1, d), (EVICT, 3, d), (ALLOC, 3, d),
                          (RECOMP, 1, d), (FREED, 3, d), (CACHED, 1, d), (CACHED, 0, d)]
    assert engine.get_output(d).num_cached_tokens == 4

    # Cached KV served B the same greedy tokens that A computed from scratch; D's first token too.
    out_a = engine.get_output(a).token_ids
    assert engine.get_output(b).token_ids == out_a
    assert engine.get_output(d).token_ids == out_a[:1]
    assert pool.num_free == 16 and all(blk.ref_count == 0 for blk in pool.blocks)


# ---------------------------------------------------------------- preemption: swap and recompute


def _two_requests_in_four_blocks(cpu_offload_blocks: int, stats: list | None = None
                                 ) -> tuple[Engine, Recorder, list[list[tuple]]]:
    """Two requests, prompt 5 and max_tokens 6 each, in a pool of 4 blocks of 4 (max_seq_len 16).
    Returns the KV/preemption events of each step (and appends each step's StepStats to `stats`)."""
    rec = Recorder()
    engine = Engine(EngineConfig(model=_model(16), block_size=4, num_kv_blocks=4,
                                 cpu_offload_blocks=cpu_offload_blocks, seed=5), rec)
    engine.add_request([256, 1, 2, 3, 4], _greedy(6))        # request 0
    engine.add_request([256, 9, 8, 7, 6], _greedy(6))        # request 1: different first block
    steps = []
    while engine.has_unfinished():
        step = engine.step()
        if stats is not None:
            stats.append(step)
        steps.append(rec.take())
        assert len(steps) < 50
    return engine, rec, steps


# Shared derivation for both preemption tests (requests r0, r1; P = 5):
# step 1: both admitted, 2 blocks each: r0 gets 0, 1; r1 gets 2, 3. Each computes 5 positions
#         (block 0 resp. 2 becomes full -> registered) and samples its first token.
# steps 2-4: decode positions 5, 6, 7 in the blocks they hold; after step 4 each has computed
#         8 positions (blocks 1 resp. 3 registered too) and has 4 output tokens (9 tokens).
# step 5: r0 must feed position 8: needs a 3rd block; none free -> preempt the newest running
#         request, r1, whose blocks are released tail-first (3 CACHED, 2 CACHED). r0 then takes a
#         block: free_uncached is empty, so the oldest cached one, 3, is evicted. Nothing else is
#         admitted in a step that preempted. r0 has 5 outputs.
# step 6: r0 feeds position 9 and gets its 6th token: finished. Its table [0, 1, 3] is released
#         tail-first: 3 FREED (positions 8-9, not full), 1 CACHED, 0 CACHED.
#         free_uncached [3], free_cached [2, 1, 0].
R0, R1 = 0, 1
STEP5_TAIL = [(EVICT, 3, R0), (ALLOC, 3, R0)]  # r0's allocation evicted r1's block
STEP6 = [(FREED, 3, R0), (CACHED, 1, R0), (CACHED, 0, R0)]


def test_preemption_by_swap_offloads_then_reloads() -> None:
    engine, rec, steps = _two_requests_in_four_blocks(cpu_offload_blocks=8)
    assert len(steps) == 8
    assert steps[0] == [(ALLOC, 0, R0), (ALLOC, 1, R0), (ALLOC, 2, R1), (ALLOC, 3, R1)]
    assert steps[1:4] == [[], [], []]
    # step 5: r1 fits the CPU tier (2 <= 8 blocks): OFFLOADED 2, 3, then released.
    assert steps[4] == [(OFFL, 2, R1), (OFFL, 3, R1), (CACHED, 3, R1), (CACHED, 2, R1),
                        ("preempt", "swap", R1)] + STEP5_TAIL
    # OFFLOADED carries each block's hash (both were registered), the same as its CACHED event.
    offl = [(b, h) for ev, b, _, h in rec.log if ev is OFFL]
    cached = [(b, h) for ev, b, r, h in rec.log if ev is CACHED and r == R1][:2]
    assert [b for b, _ in offl] == [2, 3] and all(h != 0 for _, h in offl)
    assert sorted(offl) == sorted(cached)
    assert steps[5] == STEP6
    # step 7: r1 swaps back: 2 blocks for its reloaded KV, 3 (uncached) then 2 (oldest cached,
    # evicted); RELOADED in table order 3, 2; then a 3rd block for position 8: 1 (evicted).
    # The reloaded content was copied, not recomputed: no RECOMPUTED although its hashes were
    # evicted while it was swapped out.
    assert steps[6] == [(ALLOC, 3, R1), (EVICT, 2, R1), (ALLOC, 2, R1), (RELOAD, 3, R1), (RELOAD, 2, R1),
                        (EVICT, 1, R1), (ALLOC, 1, R1)]
    # step 8: r1's 6th token; table [3, 2, 1]: 1 FREED, 2 CACHED, 3 CACHED.
    assert steps[7] == [(FREED, 1, R1), (CACHED, 2, R1), (CACHED, 3, R1)]
    assert engine.requests[R1].num_preemptions == 1
    assert [r for _, r in engine.requests[R1].times.preemptions] == ["swap"]
    assert engine.kv.cpu_free == list(range(8))[::-1] and engine.kv.cpu_tables == {}
    assert engine.kv.pool.num_free == 4


def test_a_step_counts_the_requests_its_schedule_preempted_or_swapped_in() -> None:
    """StepStats.kv_moves (no sample of the steady step time, correlate.spec_step_costs): by the
    derivation above, step 5 preempts r1 (swap), step 7 swaps it back in; no other step moves KV."""
    stats: list = []
    _, _, steps = _two_requests_in_four_blocks(cpu_offload_blocks=8, stats=stats)
    preempts = [sum(1 for e in s if e[0] == "preempt") for s in steps]
    reloads = [1 if any(e[0] is RELOAD for e in s) else 0 for s in steps]
    assert [s.kv_moves for s in stats] == [p + r for p, r in zip(preempts, reloads)] == [0, 0, 0, 0, 1, 0, 1, 0]


def test_preemption_by_recompute_refills_evicted_content() -> None:
    engine, rec, steps = _two_requests_in_four_blocks(cpu_offload_blocks=0)
    assert len(steps) == 8
    assert steps[0] == [(ALLOC, 0, R0), (ALLOC, 1, R0), (ALLOC, 2, R1), (ALLOC, 3, R1)]
    assert steps[1:4] == [[], [], []]
    # step 5: no CPU tier -> r1 releases its blocks and goes back to waiting.
    assert steps[4] == [(CACHED, 3, R1), (CACHED, 2, R1), ("preempt", "recompute", R1)] + STEP5_TAIL
    # step 6: r1 (9 tokens) could hit block 2 (its first block, still cached) but needs
    # 1 + ceil(9/4) - 1 = 3 free blocks; only 2 is free while r0 runs. Not admitted.
    assert steps[5] == STEP6
    # step 7: r1 re-admitted: it takes its own cached block 2 again (RESUME_HIT: not a prefix hit,
    # r1 had none when first admitted); 2 more blocks: 3 (uncached), then 1 (the oldest cached once 2
    # was taken; evicted, by r1). Recomputing positions 4-8 fills block 3 with r1's second block,
    # whose hash was evicted in step 5: RECOMPUTED 3.
    assert steps[6] == [(RESUME, 2, R1), (ALLOC, 3, R1), (EVICT, 1, R1), (ALLOC, 1, R1), (RECOMP, 3, R1)]
    # step 8: r1 finishes; table [2, 3, 1]: 1 FREED, 3 CACHED, 2 CACHED.
    assert steps[7] == [(FREED, 1, R1), (CACHED, 3, R1), (CACHED, 2, R1)]
    assert [r for _, r in engine.requests[R1].times.preemptions] == ["recompute"]
    assert engine.kv.pool.num_free == 4
    # Recompute after preemption yields the same greedy tokens as swapping did.
    swapped, _, _ = _two_requests_in_four_blocks(cpu_offload_blocks=8)
    for rid in (R0, R1):
        assert engine.get_output(rid).token_ids == swapped.get_output(rid).token_ids


# ---------------------------------------------------------------- invariants under random load


def _check_invariants(engine: Engine) -> None:
    kv, pool, sched = engine.kv, engine.kv.pool, engine.scheduler
    unfinished = [r for r in engine.requests.values() if not r.is_finished]
    holders = [0] * pool.num_blocks
    for req in unfinished:
        assert len(set(req.block_table)) == len(req.block_table), req.block_table
        for bid in req.block_table:
            holders[bid] += 1
        if req.status is RequestStatus.RUNNING:
            assert len(req.block_table) * kv.block_size >= req.num_computed
        else:  # waiting (never scheduled or preempted by recompute) or swapped: no device blocks
            assert req.block_table == []
        assert (req.status is RequestStatus.SWAPPED) == (req.request_id in kv.cpu_tables)
    refs = [blk.ref_count for blk in pool.blocks]
    # Shared prefix blocks are counted once per holder, so the sums match exactly; and per block.
    assert sum(refs) == sum(len(r.block_table) for r in unfinished)
    assert refs == holders
    for bid, n in enumerate(holders):
        if n > 1:  # only prefix-cached (hashed) blocks are shared
            assert pool.blocks[bid].block_hash != 0
    # A hashed block in a request's table holds exactly that request's tokens at that place, under
    # the chained hash of everything before it (never a partial or foreign block).
    bs = kv.block_size
    for req in unfinished:
        n = req.num_cached_blocks
        assert n <= len(req.block_table) and n * bs <= req.num_computed <= req.num_tokens
        tokens = req.token_ids
        chain = kv._hashes(tokens, n)  # from block 0, as a reference for the commit's running chain
        for i, h in enumerate(chain):
            blk = pool.blocks[req.block_table[i]]
            if blk.block_hash:
                assert (blk.block_hash, blk.token_ids) == (h, tuple(tokens[i * bs:(i + 1) * bs]))
        assert req.last_cached_hash == (chain[-1] if n else 0)
    assert all(len(blk.token_ids) == bs for blk in pool.blocks if blk.block_hash)
    # Free lists: disjoint, no duplicates, exactly the blocks with ref count 0.
    unc, cac = list(pool.free_uncached), list(pool.free_cached)
    assert len(set(unc)) == len(unc) and not set(unc) & set(cac)
    assert set(unc) | set(cac) == {b for b, n in enumerate(refs) if n == 0}
    assert all(pool.blocks[b].block_hash == 0 for b in unc)
    assert all(pool.blocks[b].block_hash != 0 for b in cac)
    assert all(pool.blocks[b].block_hash == h for h, b in pool.by_hash.items())
    # CPU tier: every CPU block either free or in exactly one swapped request's table.
    cpu_used = [c for ids in kv.cpu_tables.values() for c in ids]
    assert sorted(kv.cpu_free + cpu_used) == list(range(engine.config.cpu_offload_blocks))
    # Queues hold exactly the unfinished requests, each once.
    queued = [r.request_id for r in [*sched.waiting, *sched.running, *sched.swapped]]
    assert sorted(queued) == sorted(r.request_id for r in unfinished)


def _random_run(cpu_offload_blocks: int, seed: int, n_requests: int = 400) -> tuple[Engine, Recorder]:
    target = _model(64, "kv-rand-target")
    draft = ModelConfig("kv-rand-draft", d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32,
                        max_seq_len=64)
    rec = Recorder()
    # 20 blocks of 4 tokens for up to 24 concurrent requests of up to 60 tokens: preemption is
    # frequent; the CPU tier (when on) holds a few preempted requests, not all.
    engine = Engine(EngineConfig(model=target, speculative_model=draft, num_speculative_tokens=3,
                                 block_size=4, num_kv_blocks=20, cpu_offload_blocks=cpu_offload_blocks,
                                 max_num_seqs=24, max_num_batched_tokens=96, seed=seed), rec)
    rng = random.Random(seed)
    prefixes = [[256] + [rng.randrange(256) for _ in range(rng.randint(7, 23))] for _ in range(4)]
    params = {}
    for _ in range(n_requests):
        length = rng.randint(1, 40)
        if rng.random() < 0.5:
            prompt = (rng.choice(prefixes) + [rng.randrange(256) for _ in range(40)])[:length]
        else:
            prompt = [rng.randrange(259) for _ in range(length)]
        p = SamplingParams(temperature=rng.choice([0.0, 0.8]), ignore_eos=rng.random() < 0.8,
                           max_tokens=rng.randint(1, 20), use_speculation=rng.random() < 0.5)
        params[engine.add_request(prompt, p)] = p
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        _check_invariants(engine)
        assert steps < 20_000, "engine does not drain"
    # Drained: every block free with ref count 0, the CPU tier free, no request queued.
    pool = engine.kv.pool
    assert pool.num_free == pool.num_blocks
    assert all(blk.ref_count == 0 for blk in pool.blocks)
    assert sorted(engine.kv.cpu_free) == list(range(cpu_offload_blocks)) and engine.kv.cpu_tables == {}
    sched = engine.scheduler
    assert not sched.waiting and not sched.running and not sched.swapped
    assert all(r.is_finished and r.block_table == [] for r in engine.requests.values())
    for rid, p in params.items():
        out = engine.get_output(rid)
        if p.ignore_eos:  # prompt + max_tokens <= 60 < max_seq_len: only max_tokens stops it
            assert (out.finish_reason, len(out.token_ids)) == ("length", p.max_tokens)
        else:  # EOS ends it early (and is the last token), or max_tokens does
            stopped = out.token_ids[-1] == ByteTokenizer.eos_id
            assert out.finish_reason == ("stop" if stopped else "length")
            assert len(out.token_ids) <= p.max_tokens if stopped else len(out.token_ids) == p.max_tokens
            assert ByteTokenizer.eos_id not in out.token_ids[:-1]
    # Every offloaded block was reloaded (nothing aborted).
    kinds = [ev[0] for ev in rec.log]
    assert kinds.count(OFFL) == kinds.count(RELOAD)
    assert kinds.count(HIT) > 0 and kinds.count(EVICT) > 0
    assert sum(r.num_spec_proposed for r in engine.requests.values()) > 0
    return engine, rec


@pytest.fixture
def one_thread():
    # Tiny matrices: intra-op threads only add overhead (several times slower with 2+ threads).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_random_load_invariants_with_cpu_offload(one_thread: None) -> None:
    _, rec = _random_run(cpu_offload_blocks=12, seed=11)
    reasons = [r for _, r in rec.preemptions]
    assert reasons.count("swap") >= 1 and reasons.count("recompute") >= 1


def test_random_load_invariants_without_cpu_offload(one_thread: None) -> None:
    _, rec = _random_run(cpu_offload_blocks=0, seed=12)
    reasons = [r for _, r in rec.preemptions]
    assert reasons.count("recompute") >= 1 and reasons.count("swap") == 0
    assert not any(ev[0] in (OFFL, RELOAD) for ev in rec.log)
