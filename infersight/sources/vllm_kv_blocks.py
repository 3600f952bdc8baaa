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

Bounds, in entries of every kind (a broken or hostile producer can repeat a store without end):

    ids      every id of every copy of every remembered hash, together <= max_remembered_blocks
             (which bounds the hashes too: each has >= 1 id). Past it the least recently touched
             hash is forgotten; its copies still cached are counted (dropped["forgotten_cached"]),
             and a later BlockRemoved of it is an eviction whose store was not seen.
    copies   live copies of one hash <= max_copies_per_hash. vLLM makes a copy only for blocks
             computed concurrently, at most its batch's blocks; a store past the bound is dropped
             with no row and counted (dropped["copies"]), so `cached` can fall short of vLLM's
             BlockStored count by exactly that number; a removal of such a copy is still an eviction.

Request linkage: BlockStored carries the request's `session_id` (vLLM's X-Session-ID header). When
it is set, the rows' request_id is `infersight.vllm.ids.join_key(session_id)`, which is the request's
join key if the session id is the request's base id; otherwise -1 (evictions are always -1).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from infersight.correlate.frames import KV_COLUMNS, KV_EVENT_NAMES
from infersight.runtime.observer import KVBlockEvent
from infersight.sources.vllm_kv_wire import AllBlocksCleared, BlockRemoved, BlockStored, KVBatch, hash64
from infersight.vllm.ids import join_key

#: Mediums that are the device cache; other tiers (an offloading connector's CPU copies) are not
#: blocks of the device pool, and are counted as skipped rather than translated.
DEVICE_MEDIUMS = (None, "GPU")
#: Block ids remembered (every copy of every hash, live or removed) for stable ids and recompute
#: detection: about 100 bytes each in the ledger (id, list slot, the hash's key and table entry shared).
DEFAULT_MAX_REMEMBERED = 1 << 18
#: Live copies of one hash. vLLM copies a hash only for blocks computed in the same steps (see the
#: module docstring), which its batch bounds (--max-num-seqs, at most 1024 by default).
DEFAULT_MAX_COPIES = 1024
#: Why the ledger let go of something: the `reason` label of its dropped counter.
LEDGER_DROP_REASONS = ("copies", "forgotten_cached")

BlockKey = tuple[int, int, int]  # (dp rank, group idx, hash64)


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
    Bounded: at most max_remembered ids (hashes included), at most max_copies live copies of a hash."""

    def __init__(self, max_remembered: int = DEFAULT_MAX_REMEMBERED, max_copies: int = DEFAULT_MAX_COPIES) -> None:
        if not 1 <= max_copies <= max_remembered:
            raise ValueError(f"copies per hash must be between 1 and the blocks remembered ({max_remembered}), "
                             f"got {max_copies}")
        self.max_remembered, self.max_copies = max_remembered, max_copies
        self.ids: OrderedDict[BlockKey, list[int]] = OrderedDict()  # every id a key's copies have had
        self.held = 0  # ids in self.ids, all keys together
        self.live: dict[BlockKey, int] = {}  # key -> copies cached now
        self.next_id = 0
        self.skipped_other_medium = 0
        self.dropped = dict.fromkeys(LEDGER_DROP_REASONS, 0)

    @property
    def cached_blocks(self) -> int:
        return sum(self.live.values())

    def apply(self, batch: KVBatch, ts_ns: int, rows: KVRows) -> None:
        """Translate one batch, in event order, into rows stamped ts_ns."""
        for ev in batch.events:
            if isinstance(ev, AllBlocksCleared):
                self.clear(ts_ns, rows)
                continue
            if ev.medium not in DEVICE_MEDIUMS:
                self.skipped_other_medium += len(ev.block_hashes)
                continue
            group = ev.group_idx or 0
            if isinstance(ev, BlockStored):
                rid = join_key(ev.session_id) if ev.session_id else -1
                for h in ev.block_hashes:
                    self._stored((batch.dp_rank, group, hash64(h)), ts_ns, rid, rows)
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    self._removed((batch.dp_rank, group, hash64(h)), ts_ns, rows)

    def clear(self, ts_ns: int, rows: KVRows) -> None:
        """Every cached copy evicted (AllBlocksCleared, or the publisher restarted)."""
        for key, copies in self.live.items():
            for block_id in self.ids[key][:copies]:
                rows.add(ts_ns, KVBlockEvent.EVICTED, block_id, -1, key[2])
        self.live.clear()

    def forget(self) -> None:
        """Drop every remembered hash (a restarted engine hashes with a new seed)."""
        self.ids.clear()
        self.live.clear()
        self.held = 0

    def _stored(self, key: BlockKey, ts_ns: int, request_id: int, rows: KVRows) -> None:
        copies = self.live.get(key, 0)
        if copies >= self.max_copies:  # more copies than a batch can compute: not a block, a repeat
            self.dropped["copies"] += 1
            return
        ids = self.ids.get(key)
        if ids is None:
            ids = self._remember(key)
        else:
            self.ids.move_to_end(key)
            if copies == 0:  # cached before, evicted since, and computed again
                rows.add(ts_ns, KVBlockEvent.RECOMPUTED, ids[0], request_id, key[2])
        if copies == len(ids):
            self._add_id(ids)
        self.live[key] = copies + 1
        rows.add(ts_ns, KVBlockEvent.CACHED, ids[copies], request_id, key[2])

    def _removed(self, key: BlockKey, ts_ns: int, rows: KVRows) -> None:
        copies = self.live.get(key, 0)
        ids = self.ids.get(key)
        if ids is None:  # its store was never seen (lost, or before we joined): still an eviction
            ids = self._remember(key)
            self._add_id(ids)
        else:
            self.ids.move_to_end(key)
        if copies:
            self.live[key] = copies - 1
            if copies == 1:
                del self.live[key]
        rows.add(ts_ns, KVBlockEvent.EVICTED, ids[max(copies - 1, 0)], -1, key[2])

    def _remember(self, key: BlockKey) -> list[int]:
        """A new key's (empty) id list, at the recent end, room made for its first id."""
        self._make_room()
        ids: list[int] = []
        self.ids[key] = ids
        return ids

    def _make_room(self) -> None:
        """Forget the least recently touched hashes until one more id fits. The key about to take the
        id is the most recent one and holds at most max_copies <= max_remembered ids, so it is never
        the one forgotten while the table is over its bound."""
        while self.held >= self.max_remembered:
            old, old_ids = self.ids.popitem(last=False)
            self.held -= len(old_ids)
            self.dropped["forgotten_cached"] += self.live.pop(old, 0)

    def _add_id(self, ids: list[int]) -> None:
        self._make_room()
        ids.append(self.next_id)
        self.held += 1
        self.next_id += 1
