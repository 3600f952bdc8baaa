"""The device KV block pool: block ids, ref counts, and the prefix cache over full blocks.

A block whose ref count drops to 0 is free. If it holds a full, hashed block it stays findable
by its hash ("cached") until the pool needs it for something else ("evicted"):

    free_uncached:  [7, 3]           handed out first, oldest first
    free_cached:    [5, 2, 9]        least recently freed first  -> evicted in this order
    by_hash:        {h(5): 5, h(2): 2, h(9): 9, ...also hashes of blocks still in use}

A hash hit also compares the block's token ids, so a hash collision can never serve wrong KV.
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Sequence

from infersight.runtime.observer import EngineObserver, KVBlockEvent


def block_hash(prev_hash: int, token_ids: Sequence[int]) -> int:
    """Chained hash of a full block: depends on every token before it. 63 bits, never 0."""
    h = hashlib.blake2b(prev_hash.to_bytes(8, "little"), digest_size=8)
    # Each token as 4 little-endian bytes, packed in one C call (a join over to_bytes held the serving
    # engine's GIL ~4% of the time on the H200).
    h.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return (int.from_bytes(h.digest(), "little") >> 1) or 1


@dataclass
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: int = 0          # 0: not registered in the prefix cache
    token_ids: tuple[int, ...] = ()


class KVBlockPool:
    def __init__(self, num_blocks: int, observer: EngineObserver, evicted_memory: int | None = None) -> None:
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_uncached: deque[int] = deque(range(num_blocks))
        self.free_cached: OrderedDict[int, None] = OrderedDict()
        self.by_hash: dict[int, int] = {}
        # Hashes evicted recently; filling one of them again is counted as recomputation.
        self.evicted_hashes: OrderedDict[int, None] = OrderedDict()
        self.evicted_memory = evicted_memory if evicted_memory is not None else 4 * num_blocks
        self.observer = observer

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free_uncached) + len(self.free_cached)

    @property
    def num_in_use(self) -> int:
        return self.num_blocks - self.num_free

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int, request_id: int) -> list[int]:
        """n empty blocks for a request. Call can_allocate first; running short is a bug."""
        if n == 0:  # most decode steps need no new block
            return []
        if not self.can_allocate(n):
            raise RuntimeError(f"allocate({n}) with only {self.num_free} free blocks")
        ids = []
        for _ in range(n):
            if self.free_uncached:
                bid = self.free_uncached.popleft()
            else:
                bid, _ = self.free_cached.popitem(last=False)
                self._evict(self.blocks[bid], request_id)
            block = self.blocks[bid]
            block.ref_count = 1
            ids.append(bid)
            self.observer.on_kv_block(KVBlockEvent.ALLOCATED, bid, request_id, 0)
        return ids

    def _evict(self, block: KVBlock, request_id: int) -> None:
        """Drop a cached free block's content. request_id: whose allocation needed the block (the
        eviction's blame; -1 for a reset), carried by the EVICTED event."""
        del self.by_hash[block.block_hash]
        self.evicted_hashes[block.block_hash] = None
        if len(self.evicted_hashes) > self.evicted_memory:
            self.evicted_hashes.popitem(last=False)
        self.observer.on_kv_block(KVBlockEvent.EVICTED, block.block_id, request_id, block.block_hash)
        block.block_hash, block.token_ids = 0, ()

    def lookup(self, h: int, token_ids: Sequence[int]) -> int | None:
        """The block holding exactly these tokens after this prefix, if cached."""
        bid = self.by_hash.get(h)
        if bid is None or self.blocks[bid].token_ids != tuple(token_ids):
            return None
        return bid

    def acquire_cached(self, bid: int, request_id: int, event: KVBlockEvent = KVBlockEvent.PREFIX_HIT) -> None:
        """Reuse a block found by lookup(): a prefix hit, or RESUME_HIT when a preempted request takes
        cached KV again on re-admission (its hits were counted when it was first admitted)."""
        block = self.blocks[bid]
        if block.ref_count == 0:
            del self.free_cached[bid]
        block.ref_count += 1
        self.observer.on_kv_block(event, bid, request_id, block.block_hash)

    def register(self, bid: int, h: int, token_ids: Sequence[int], request_id: int,
                 recomputed: bool = True) -> bool:
        """Make a full, computed block findable by hash. False if another block already holds it.
        recomputed=False: the content was copied back from the CPU tier, so an evicted hash coming
        back is not wasted work and emits no RECOMPUTED."""
        if h in self.by_hash:
            return False
        block = self.blocks[bid]
        block.block_hash, block.token_ids = h, tuple(token_ids)
        self.by_hash[h] = bid
        if h in self.evicted_hashes:
            del self.evicted_hashes[h]
            if recomputed:
                self.observer.on_kv_block(KVBlockEvent.RECOMPUTED, bid, request_id, h)
        return True

    def release(self, block_ids: Sequence[int], request_id: int) -> None:
        """Drop one reference to each block. Released tail-first, so a request's last blocks
        (the least likely to be shared) are the first to be evicted."""
        for bid in reversed(block_ids):
            block = self.blocks[bid]
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            if block.block_hash:
                self.free_cached[bid] = None
                self.observer.on_kv_block(KVBlockEvent.CACHED, bid, request_id, block.block_hash)
            else:
                self.free_uncached.append(bid)
                self.observer.on_kv_block(KVBlockEvent.FREED, bid, request_id, 0)

    def reset_prefix_cache(self) -> None:
        """Forget every cached free block (for benchmarks and tests); blocks in use keep theirs."""
        while self.free_cached:
            bid, _ = self.free_cached.popitem(last=False)
            self._evict(self.blocks[bid], -1)
            self.free_uncached.append(bid)
