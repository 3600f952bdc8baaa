"""vLLM's prefix-cache events as our runtime's KV block lifecycle (the `kv_events` frame).

vLLM publishes what enters and leaves its prefix cache, by content hash; it does not publish block
ids, allocations or reference counts. The mapping onto `KVBlockEvent`:

    BlockStored  hash h   ->  CACHED    the block's content became reusable (vLLM hashes a block
                              into the cache as soon as it is full)
                          ->  RECOMPUTED first, when h had been cached before and no copy of it is
                              cached now: vLLM computed evicted content again (wasted prefill)
    BlockRemoved hash h   ->  EVICTED   the content was dropped (its block was reused)
    AllBlocksCleared      ->  EVICTED   for every block still cached (also on a publisher restart:
                              the restarted engine's cache starts empty)

So, in `correlate.kv` terms, CACHED -> EVICTED is how long content stayed reusable in vLLM's cache
(`idle_before_evict`), the evicted count is vLLM's evictions, and block_states' "cached" is the
number of hashes vLLM holds. There is no ALLOCATED, so no `lifetime` interval: vLLM does not say
when a block was handed out.

Blocks have no ids on the wire: each (dp rank, KV cache group, hash) gets a stable synthetic block id,
kept while the hash is remembered, so a hash cached again gets its old id back. Two blocks can hold
the same hash at once: vLLM does not de-duplicate its cache (block_pool.py keeps hash -> {block id:
block}, so that block tables stay append-only), so two requests that computed the same block in the
same steps store, and later remove, the hash twice. A BlockStored for a hash already cached is
therefore another copy, with its own id; each BlockRemoved drops one copy (the newest id first).

Bounds, in bytes and in entries of every kind (a broken or hostile producer can repeat a store
without end):

    ids      every id of every copy of every remembered hash lives in one table allocated once at
             `remember_bytes` (kv_remembered: 32-byte slots filled to 3/4 at most, 42.7 bytes an
             id; the default 8 MiB holds 196,608 ids). Past it the least recently touched hash is
             forgotten with all its copies (dropped["forgotten"] counts the hashes); its copies still
             cached are counted too (dropped["forgotten_cached"]), and a later BlockRemoved of it is an
             eviction whose store was not seen.
    copies   live copies of one hash <= max_copies_per_hash. vLLM makes a copy only for blocks
             computed concurrently, at most its batch's blocks; a store past the bound is dropped
             with no row and counted (dropped["copies"]), so `cached` can fall short of vLLM's
             BlockStored count by exactly that number; a removal of such a copy is still an eviction.

Request linkage: BlockStored carries the request's `session_id` (vLLM's X-Session-ID header). When
it is set, the rows' request_id is `infersight.vllm.ids.join_key(session_id)`, which is the request's
join key if the session id is the request's base id; otherwise -1 (evictions are always -1).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from infersight.correlate.frames import KV_COLUMNS, KV_EVENT_NAMES
from infersight.runtime.observer import KVBlockEvent
from infersight.sources.vllm.kv_remembered import MAX_COPIES, NONE, RememberedBlocks, capacity_for
from infersight.sources.vllm.kv_wire import AllBlocksCleared, BlockRemoved, BlockStored, KVBatch, hash64
from infersight.vllm.ids import join_key

#: Mediums that are the device cache; other tiers (an offloading connector's CPU copies) are not
#: blocks of the device pool, and are counted as skipped rather than translated.
DEVICE_MEDIUMS = (None, "GPU")
#: Bytes of the table of remembered block ids (every copy of every hash, live or removed) for stable
#: ids and recompute detection: 8 MiB, 196,608 ids (kv_remembered), above the blocks of one
#: H200's cache (~50,000 blocks of 16 tokens for an 8B model) with room for what it evicted.
DEFAULT_REMEMBER_BYTES = 8 << 20
#: Live copies of one hash. vLLM copies a hash only for blocks computed in the same steps (see the
#: module docstring), which its batch bounds (--max-num-seqs, at most 1024 by default).
DEFAULT_MAX_COPIES = 1024
#: Why the ledger let go of something: the `reason` label of its dropped counter (copies: stores past
#: the copies bound; forgotten_cached: cached copies of forgotten hashes; forgotten: hashes forgotten).
LEDGER_DROP_REASONS = ("copies", "forgotten_cached", "forgotten")


@dataclass
class KVRows:
    """Rows of a kv_events frame being built (columns of correlate.frames KV_COLUMNS)."""

    ts_ns: list[int] = field(default_factory=list)
    event: list[int] = field(default_factory=list)
    block_id: list[int] = field(default_factory=list)
    request_id: list[int] = field(default_factory=list)
    block_hash: list[int] = field(default_factory=list)

    def add(self, ts_ns: int, event: KVBlockEvent, block_id: int, request_id: int, block_hash: int) -> None:
        self.ts_ns.append(ts_ns)
        self.event.append(int(event))
        self.block_id.append(block_id)
        self.request_id.append(request_id)
        self.block_hash.append(block_hash)

    def __len__(self) -> int:
        return len(self.ts_ns)

    def frame(self) -> pd.DataFrame:
        """The kv_events frame, in emission order."""
        names = np.array([KV_EVENT_NAMES[e] for e in self.event], dtype=object)
        return pd.DataFrame({
            "ts_ns": np.asarray(self.ts_ns, np.int64), "event": names,
            "block_id": np.asarray(self.block_id, np.int64), "request_id": np.asarray(self.request_id, np.int64),
            "block_hash": np.asarray(self.block_hash, np.uint64)}).astype(KV_COLUMNS)




class KVBlockLedger:
    """Synthetic block ids per hash, which hashes are cached now, and the translation of batches.
    Bounded: at most `remember_bytes` of remembered ids (hashes included), at most max_copies live
    copies of a hash."""

    def __init__(self, remember_bytes: int = DEFAULT_REMEMBER_BYTES, max_copies: int = DEFAULT_MAX_COPIES) -> None:
        self.check(remember_bytes, max_copies)
        self.blocks = RememberedBlocks(remember_bytes)
        self.max_copies = max_copies
        self.cached_blocks = 0  # live copies of all hashes
        self.next_id = 0
        self.skipped_other_medium = 0
        self.dropped = dict.fromkeys(LEDGER_DROP_REASONS, 0)

    @staticmethod
    def check(remember_bytes: int, max_copies: int) -> None:
        """Raise ValueError unless the bounds make a ledger (a hash's copies fit in what is remembered)."""
        limit = min(capacity_for(remember_bytes), MAX_COPIES)
        if not 1 <= max_copies <= limit:
            raise ValueError(f"copies per hash must be between 1 and {limit} (the ids {remember_bytes} bytes "
                             f"remember), got {max_copies}")

    def apply(self, batch: KVBatch, ts_ns: int, rows: KVRows) -> None:
        """Translate one batch, in event order, into rows stamped ts_ns."""
        for ev in batch.events:
            if isinstance(ev, AllBlocksCleared):
                self.clear(ts_ns, rows)
                continue
            if ev.medium not in DEVICE_MEDIUMS:
                self.skipped_other_medium += len(ev.block_hashes)
                continue
            group = ev.group_idx or 0  # < 2^16, as the wire checks; dp rank too
            place = batch.dp_rank << 16 | group
            if isinstance(ev, BlockStored):
                rid = join_key(ev.session_id) if ev.session_id else -1
                for h in ev.block_hashes:
                    self._stored(place, hash64(h), ts_ns, rid, rows)
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    self._removed(place, hash64(h), ts_ns, rows)

    def clear(self, ts_ns: int, rows: KVRows) -> None:
        """Every cached copy evicted (AllBlocksCleared, or the publisher restarted), least recent hash first."""
        t = self.blocks
        for i in list(t.live_entries()):
            place, h = t.place[i], t.hash[i]
            for copy in range(t.live[i]):
                rows.add(ts_ns, KVBlockEvent.EVICTED, t.block[i if copy == 0 else t.find(place, h, copy)], -1, h)
            t.live[i] = 0
        self.cached_blocks = 0

    def forget(self) -> None:
        """Drop every remembered hash (a restarted engine hashes with a new seed)."""
        self.blocks.reset()
        self.cached_blocks = 0

    def _stored(self, place: int, h: int, ts_ns: int, request_id: int, rows: KVRows) -> None:
        t = self.blocks
        base = t.find(place, h, 0)
        copies = t.live[base] if base != NONE else 0
        if copies >= self.max_copies:  # more copies than a batch can compute: not a block, a repeat
            self.dropped["copies"] += 1
            return
        if base == NONE:
            base = slot = self._add(place, h, 0)
        else:
            t.touch(base)
            if copies == 0:  # cached before, evicted since, and computed again
                rows.add(ts_ns, KVBlockEvent.RECOMPUTED, t.block[base], request_id, h)
            slot = base if copies == 0 else t.find(place, h, copies)
            if slot == NONE:  # one more copy than the hash has had: a new id
                slot = self._add(place, h, copies)
                base = t.find(place, h, 0)  # making room may have moved it
        t.live[base] = copies + 1
        self.cached_blocks += 1
        rows.add(ts_ns, KVBlockEvent.CACHED, t.block[slot], request_id, h)

    def _removed(self, place: int, h: int, ts_ns: int, rows: KVRows) -> None:
        t = self.blocks
        base = t.find(place, h, 0)
        if base == NONE:  # its store was never seen (lost, or before we joined): still an eviction
            rows.add(ts_ns, KVBlockEvent.EVICTED, t.block[self._add(place, h, 0)], -1, h)
            return
        t.touch(base)
        copies = t.live[base]
        if copies:
            t.live[base] = copies - 1
            self.cached_blocks -= 1
        slot = base if copies <= 1 else t.find(place, h, copies - 1)
        rows.add(ts_ns, KVBlockEvent.EVICTED, t.block[slot], -1, h)

    def _add(self, place: int, h: int, copy: int) -> int:
        """A new id for (place, h, copy), room made first by forgetting the least recent hashes. The hash
        being served is the most recent (touched, or not in the table yet) and a hash needs another id
        only while its ids < max_copies <= capacity, so it is never the one forgotten."""
        t = self.blocks
        while t.used >= t.capacity:
            _, live, _ = t.evict_oldest()
            self.dropped["forgotten"] += 1
            self.dropped["forgotten_cached"] += live
            self.cached_blocks -= live
        slot = t.insert(place, h, copy, self.next_id)
        self.next_id += 1
        return slot
