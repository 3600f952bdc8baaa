"""Tests for infersight.runtime.kv.kv_pool: exact pool state on small scripted cases.

Every expected value is worked out by hand from the documented behaviour (comments show how):
fresh pools hand out ids 0, 1, 2, ...; release is tail-first; a released block with a hash goes
to free_cached (evicted least recently freed first), one without goes to the back of
free_uncached (handed out before any cached block is evicted)."""

from __future__ import annotations

import hashlib

import pytest

from infersight.runtime.kv.kv_pool import KVBlockPool, block_hash
from infersight.runtime.observer import EngineObserver, KVBlockEvent

E = KVBlockEvent


class Recorder(EngineObserver):
    """Records every KV block event as (event, block_id, request_id, block_hash)."""

    def __init__(self) -> None:
        self.events: list[tuple[KVBlockEvent, int, int, int]] = []

    def on_kv_block(self, event: KVBlockEvent, block_id: int, request_id: int, block_hash: int) -> None:
        self.events.append((event, block_id, request_id, block_hash))

    def take(self) -> list[tuple[KVBlockEvent, int, int, int]]:
        out, self.events = self.events, []
        return out

    def kinds(self, kind: KVBlockEvent) -> list[int]:
        return [bid for ev, bid, _, _ in self.events if ev is kind]


def _ref_hash(prev: int, tokens: list[int]) -> int:
    """Independent reimplementation of block_hash's documented rule: blake2b with an 8-byte digest
    over prev (8 bytes little-endian) then each token (4 bytes little-endian); the digest read as a
    little-endian integer, shifted right by one (63 bits), and 1 if that is 0."""
    data = prev.to_bytes(8, "little") + b"".join(t.to_bytes(4, "little") for t in tokens)
    v = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1
    return v if v else 1


def _chain(blocks: list[list[int]]) -> list[int]:
    hashes, prev = [], 0
    for toks in blocks:
        prev = block_hash(prev, toks)
        hashes.append(prev)
    return hashes


def _ref_counts(pool: KVBlockPool) -> list[int]:
    return [b.ref_count for b in pool.blocks]


# ---------------------------------------------------------------- block_hash


def test_block_hash_matches_independent_blake2b() -> None:
    blocks = [[256, 72, 101, 108], [108, 111, 32, 119], [0, 1, 2, 3]]
    prev_ref = 0
    for toks, h in zip(blocks, _chain(blocks)):
        prev_ref = _ref_hash(prev_ref, toks)
        assert h == prev_ref
        assert 0 < h < 2 ** 63
    # Chaining: the same tokens after a different prefix hash differently.
    h0 = block_hash(0, blocks[0])
    assert block_hash(h0, blocks[1]) != block_hash(0, blocks[1])
    # Order within the block matters.
    assert block_hash(0, [1, 2, 3, 4]) != block_hash(0, [4, 3, 2, 1])


# ---------------------------------------------------------------- allocation and release order


def test_fresh_pool_allocates_ids_in_order() -> None:
    rec = Recorder()
    pool = KVBlockPool(6, rec)
    assert pool.allocate(3, request_id=0) == [0, 1, 2]
    assert pool.allocate(2, request_id=1) == [3, 4]
    assert rec.take() == [(E.ALLOCATED, 0, 0, 0), (E.ALLOCATED, 1, 0, 0), (E.ALLOCATED, 2, 0, 0),
                          (E.ALLOCATED, 3, 1, 0), (E.ALLOCATED, 4, 1, 0)]
    assert _ref_counts(pool) == [1, 1, 1, 1, 1, 0]
    assert (pool.num_free, pool.num_in_use) == (1, 5)
    assert pool.can_allocate(1) and not pool.can_allocate(2)
    with pytest.raises(RuntimeError):
        pool.allocate(2, request_id=2)
    assert rec.take() == []  # a refused allocation emits nothing and changes nothing
    assert list(pool.free_uncached) == [5]


def test_release_is_tail_first_and_splits_cached_from_uncached() -> None:
    rec = Recorder()
    pool = KVBlockPool(6, rec)
    table = pool.allocate(4, request_id=7)                 # [0, 1, 2, 3]; free_uncached [4, 5]
    h = _chain([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert pool.register(table[0], h[0], [1, 2, 3, 4], 7)
    assert pool.register(table[1], h[1], [5, 6, 7, 8], 7)
    rec.take()
    pool.release(table, request_id=7)
    # Tail first: 3 and 2 hold no hash -> FREED (appended to free_uncached after 4, 5);
    # 1 then 0 hold hashes -> CACHED, in that order, so 1 is the least recently freed.
    assert rec.take() == [(E.FREED, 3, 7, 0), (E.FREED, 2, 7, 0),
                          (E.CACHED, 1, 7, h[1]), (E.CACHED, 0, 7, h[0])]
    assert list(pool.free_uncached) == [4, 5, 3, 2]
    assert list(pool.free_cached) == [1, 0]
    assert _ref_counts(pool) == [0] * 6
    assert pool.num_free == 6
    # Cached free blocks stay findable.
    assert pool.lookup(h[0], [1, 2, 3, 4]) == 0
    assert pool.lookup(h[1], [5, 6, 7, 8]) == 1
    # Uncached blocks are handed out first, oldest first; no eviction while any is left.
    assert pool.allocate(4, request_id=8) == [4, 5, 3, 2]
    assert rec.kinds(E.EVICTED) == []
    # Then the least recently freed cached block: 1 (freed before 0).
    assert pool.allocate(1, request_id=8) == [1]
    assert [(ev, bid) for ev, bid, _, _ in rec.take()][-2:] == [(E.EVICTED, 1), (E.ALLOCATED, 1)]


# ---------------------------------------------------------------- prefix lookup


def test_prefix_chain_lookup_and_token_check() -> None:
    rec = Recorder()
    pool = KVBlockPool(8, rec)
    toks = [[10, 11, 12, 13], [14, 15, 16, 17], [18, 19, 20, 21]]
    hashes = _chain(toks)
    table = pool.allocate(3, request_id=0)                 # [0, 1, 2]
    for bid, hh, t in zip(table, hashes, toks):
        assert pool.register(bid, hh, t, 0)
    assert [pool.blocks[b].block_hash for b in table] == hashes
    assert [pool.blocks[b].token_ids for b in table] == [tuple(t) for t in toks]
    assert pool.by_hash == {hashes[0]: 0, hashes[1]: 1, hashes[2]: 2}
    # Found by (hash, tokens); registering emits nothing (no hash was ever evicted).
    assert [pool.lookup(hh, t) for hh, t in zip(hashes, toks)] == [0, 1, 2]
    assert rec.take() == [(E.ALLOCATED, 0, 0, 0), (E.ALLOCATED, 1, 0, 0), (E.ALLOCATED, 2, 0, 0)]
    # The second block's tokens without the first block as prefix: a different hash, not found.
    assert pool.lookup(block_hash(0, toks[1]), toks[1]) is None
    # Unknown hash.
    assert pool.lookup(12345, toks[0]) is None
    # Simulated collision: the same hash with other tokens must not be served.
    assert pool.lookup(hashes[1], [14, 15, 16, 99]) is None
    assert pool.lookup(hashes[1], toks[0]) is None
    # lookup accepts any sequence type for the tokens.
    assert pool.lookup(hashes[2], tuple(toks[2])) == 2


def test_register_refuses_duplicate_hash() -> None:
    rec = Recorder()
    pool = KVBlockPool(4, rec)
    a, b = pool.allocate(2, request_id=0)                  # 0, 1
    hh = block_hash(0, [1, 2])
    assert pool.register(a, hh, [1, 2], 0) is True
    assert pool.register(b, hh, [1, 2], 1) is False
    # The refused block stays unregistered; the hash still points at the first block.
    assert (pool.blocks[b].block_hash, pool.blocks[b].token_ids) == (0, ())
    assert pool.by_hash == {hh: a}
    rec.take()
    pool.release([a, b], 0)
    # Tail first: b unhashed -> FREED; a hashed -> CACHED.
    assert [(ev, bid) for ev, bid, _, _ in rec.take()] == [(E.FREED, b), (E.CACHED, a)]


# ---------------------------------------------------------------- eviction


def test_exact_eviction_order_and_recompute() -> None:
    rec = Recorder()
    pool = KVBlockPool(6, rec)
    table = pool.allocate(6, request_id=0)                 # [0..5]; free lists empty
    toks = {bid: [bid * 10 + j for j in range(4)] for bid in range(4)}
    hashes = {bid: block_hash(0, toks[bid]) for bid in range(4)}
    for bid in range(4):
        assert pool.register(bid, hashes[bid], toks[bid], 0)
    rec.take()
    # Free in a scripted order: 2, then 0, then [3, 1] (tail first: 1 then 3), then 4 (unhashed).
    pool.release([2], 0)
    pool.release([0], 0)
    pool.release([3, 1], 0)
    pool.release([4], 0)
    assert [(ev, bid) for ev, bid, _, _ in rec.take()] == [
        (E.CACHED, 2), (E.CACHED, 0), (E.CACHED, 1), (E.CACHED, 3), (E.FREED, 4)]
    assert list(pool.free_cached) == [2, 0, 1, 3]
    assert list(pool.free_uncached) == [4]
    assert table[5] == 5 and pool.blocks[5].ref_count == 1
    # Ask for 4 blocks: 4 from the uncached list, then evict 2, 0, 1 (least recently freed first).
    got = pool.allocate(4, request_id=1)
    assert got == [4, 2, 0, 1]
    events = rec.take()
    assert [(ev, bid) for ev, bid, _, _ in events] == [
        (E.ALLOCATED, 4), (E.EVICTED, 2), (E.ALLOCATED, 2), (E.EVICTED, 0), (E.ALLOCATED, 0),
        (E.EVICTED, 1), (E.ALLOCATED, 1)]
    # EVICTED carries the dropped hash and the request whose allocation evicted it (the blame): 1.
    assert [(bid, rid, hh) for ev, bid, rid, hh in events if ev is E.EVICTED] == [
        (2, 1, hashes[2]), (0, 1, hashes[0]), (1, 1, hashes[1])]
    # Evicted blocks forget their content; only 3 is still findable.
    assert all(pool.blocks[b].block_hash == 0 and pool.blocks[b].token_ids == () for b in (2, 0, 1))
    assert pool.by_hash == {hashes[3]: 3}
    assert pool.lookup(hashes[2], toks[2]) is None
    assert pool.lookup(hashes[3], toks[3]) == 3
    assert list(pool.evicted_hashes) == [hashes[2], hashes[0], hashes[1]]
    assert list(pool.free_cached) == [3] and list(pool.free_uncached) == []
    # Filling block 4 with what block 2 held: RECOMPUTED, attributed to the filling request.
    assert pool.register(4, hashes[2], toks[2], 1) is True
    assert rec.take() == [(E.RECOMPUTED, 4, 1, hashes[2])]
    assert list(pool.evicted_hashes) == [hashes[0], hashes[1]]
    # The same hash again: duplicate, refused, no event.
    assert pool.register(2, hashes[2], toks[2], 1) is False
    # A never-seen hash: registered silently.
    assert pool.register(2, block_hash(0, [7, 7, 7, 7]), [7, 7, 7, 7], 1) is True
    assert rec.take() == []
    # Content copied back (not recomputed) clears the evicted hash without RECOMPUTED.
    assert pool.register(0, hashes[0], toks[0], 1, recomputed=False) is True
    assert rec.take() == []
    assert list(pool.evicted_hashes) == [hashes[1]]


def test_evicted_hash_memory_is_bounded() -> None:
    rec = Recorder()
    pool = KVBlockPool(2, rec, evicted_memory=1)
    a, b = pool.allocate(2, 0)
    ha, hb = block_hash(0, [1]), block_hash(0, [2])
    pool.register(a, ha, [1], 0)
    pool.register(b, hb, [2], 0)
    pool.release([a, b], 0)                                # tail first: free_cached [b, a]
    assert pool.allocate(2, 1) == [b, a]                    # evicts b, then a
    # Memory of one: remembering ha pushed hb out.
    assert list(pool.evicted_hashes) == [ha]
    rec.take()
    pool.register(a, hb, [2], 1)                           # forgotten: no RECOMPUTED
    pool.register(b, ha, [1], 1)                           # remembered: RECOMPUTED
    assert rec.take() == [(E.RECOMPUTED, b, 1, ha)]


# ---------------------------------------------------------------- prefix hits and ref counts


def test_acquire_cached_ref_counts_and_free_list() -> None:
    rec = Recorder()
    pool = KVBlockPool(4, rec)
    table = pool.allocate(2, request_id=0)                 # [0, 1]; free_uncached [2, 3]
    hh = block_hash(0, [5, 6, 7, 8])
    pool.register(0, hh, [5, 6, 7, 8], 0)
    rec.take()
    # A hit on a block in use: ref 2, the free lists untouched.
    pool.acquire_cached(0, request_id=1)
    assert rec.take() == [(E.PREFIX_HIT, 0, 1, hh)]
    assert _ref_counts(pool) == [2, 1, 0, 0]
    assert pool.num_free == 2
    # Request 0 finishes: tail first, 1 -> FREED; 0 drops to ref 1, no event.
    pool.release(table, request_id=0)
    assert rec.take() == [(E.FREED, 1, 0, 0)]
    assert _ref_counts(pool) == [1, 0, 0, 0]
    assert list(pool.free_uncached) == [2, 3, 1]
    # Request 1 finishes: 0 -> CACHED.
    pool.release([0], request_id=1)
    assert rec.take() == [(E.CACHED, 0, 1, hh)]
    assert list(pool.free_cached) == [0] and pool.num_free == 4
    # A hit on the free cached block takes it off the free list.
    assert pool.lookup(hh, [5, 6, 7, 8]) == 0
    pool.acquire_cached(0, request_id=2)
    assert rec.take() == [(E.PREFIX_HIT, 0, 2, hh)]
    assert list(pool.free_cached) == [] and list(pool.free_uncached) == [2, 3, 1]
    assert _ref_counts(pool) == [1, 0, 0, 0]
    assert (pool.num_free, pool.num_in_use) == (3, 1)
    # Its content is safe: the remaining 3 free blocks are handed out without any eviction.
    assert pool.allocate(3, request_id=3) == [2, 3, 1]
    assert rec.kinds(E.EVICTED) == []
    assert not pool.can_allocate(1)
    # Another hit on the same block: ref 2.
    pool.acquire_cached(0, request_id=4)
    assert _ref_counts(pool) == [2, 1, 1, 1]
    pool.release([0], 2)
    pool.release([0], 4)
    pool.release([2, 3, 1], 3)
    assert _ref_counts(pool) == [0, 0, 0, 0]
    assert pool.num_free == 4
    assert list(pool.free_cached) == [0] and list(pool.free_uncached) == [1, 3, 2]


def test_reset_prefix_cache_keeps_blocks_in_use() -> None:
    rec = Recorder()
    pool = KVBlockPool(3, rec)
    pool.allocate(3, 0)
    hs = [block_hash(0, [i]) for i in range(3)]
    for i in range(3):
        pool.register(i, hs[i], [i], 0)
    pool.release([0, 1], 0)                                # tail first: free_cached [1, 0]
    rec.take()
    pool.reset_prefix_cache()
    # Cached free blocks evicted in LRU order and moved to the uncached list; block 2 (in use) kept.
    assert rec.take() == [(E.EVICTED, 1, -1, hs[1]), (E.EVICTED, 0, -1, hs[0])]
    assert list(pool.free_uncached) == [1, 0] and list(pool.free_cached) == []
    assert pool.by_hash == {hs[2]: 2}
    assert pool.num_free == 2
