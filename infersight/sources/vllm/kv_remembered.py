"""The vLLM KV ledger's memory: every remembered block id in one table of 32-byte slots, sized once.

Why a table and not Python objects: the ledger remembers every hash it has seen, live or removed, for
stable block ids and recompute detection. As a tuple key, an OrderedDict node and an id list, one hash
cost 334 bytes (tracemalloc), so the old bound of 2^18 ids was ~88 MB and an agent on a vLLM stream
grew for hours towards it. Here the whole table is allocated when the ledger is made, at a byte budget
(`max_bytes`), and never grows: the memory is the budget from the first event on, whatever arrives.

Layout: open addressing with linear probing over `slots` (a power of two), filled to at most 3/4 of it
(`capacity` entries) so that a probe stays a few slots long. An entry is keyed by (place, hash, copy):
place = dp rank << 16 | KV cache group, copy = which copy of the hash (0: the hash's first). The copy-0
entry is the hash's own: it holds its live copies and its place in the recency list (doubly linked
through prev/next, least recent at the head). Copies >= 1 hold only their block id and are forgotten
with their hash. A deletion shifts back the entries after it (no tombstones), so the table never needs
a rebuild and no poll pays for one.

    array   type        bytes a slot
    hash    uint64      8
    block   int64       8   the synthetic block id
    place   uint32      4
    copy    uint16      2   EMPTY (0xFFFF) marks a free slot
    live    uint16      2   copy 0 only: live copies of the hash
    prev    int32       4   copy 0 only: the recency list
    next    int32       4
                       32   (42.7 bytes an entry at the 3/4 fill)
"""
from __future__ import annotations

import secrets
from array import array
from typing import Iterator

SLOT_BYTES = 32
#: A free slot's copy index; a copy index is below the ledger's copies bound, which is below this.
EMPTY = 0xFFFF
MAX_COPIES = EMPTY - 1
NONE = -1
_MASK64 = (1 << 64) - 1
_MIX = 0x9E3779B97F4A7C15  # Fibonacci hashing: the top bits of key * 2^64/phi spread any key set
_PLACE_MIX = 0xC2B2AE3D27D4EB4F
MAX_SLOTS = 1 << 30  # prev/next are int32


def slots_for(max_bytes: int) -> int:
    """The most slots (a power of two, at least 4) that fit in max_bytes."""
    if max_bytes < 4 * SLOT_BYTES:
        raise ValueError(f"the remembered-blocks budget must be at least {4 * SLOT_BYTES} bytes, got {max_bytes}")
    return min(1 << ((max_bytes // SLOT_BYTES).bit_length() - 1), MAX_SLOTS)


def capacity_for(max_bytes: int) -> int:
    """Entries a table of max_bytes holds: 3/4 of its slots."""
    return slots_for(max_bytes) * 3 // 4


class RememberedBlocks:
    """Block ids by (place, hash, copy) in `capacity` entries at most, with recency over hashes.
    Slot numbers move when an entry is deleted: look a slot up again after `evict_oldest`."""

    def __init__(self, max_bytes: int) -> None:
        self.slots = slots_for(max_bytes)
        self.capacity = capacity_for(max_bytes)
        self.bytes = self.slots * SLOT_BYTES
        self._mask = self.slots - 1
        self._shift = 64 - (self.slots.bit_length() - 1)
        # A salt per table: without it a producer could pick hashes that share a home and make every
        # probe walk the whole table; with it, where a hash lands is not known outside this process.
        self._salt = secrets.randbits(64)
        self._allocate()

    def _allocate(self) -> None:
        n = self.slots
        self.hash, self.block = array("Q", [0]) * n, array("q", [0]) * n
        self.place, self.copy = array("I", [0]) * n, array("H", [EMPTY]) * n
        self.live = array("H", [0]) * n
        self.prev, self.next = array("i", [NONE]) * n, array("i", [NONE]) * n
        self.head = self.tail = NONE
        self.used = 0
        self.copies_held = 0  # entries of copies >= 1: none in the usual stream, so no search for them

    def reset(self) -> None:
        """Forget everything (the arrays are made again, at the same size)."""
        self._allocate()

    def _home(self, place: int, h: int, copy: int) -> int:
        key = h ^ self._salt ^ (((place << 16) | copy) * _PLACE_MIX & _MASK64)
        return (key * _MIX & _MASK64) >> self._shift

    def find(self, place: int, h: int, copy: int) -> int:
        """The entry's slot, or NONE. Ends: at most 3/4 of the slots are used, so a free one is met."""
        copies, hashes, places, mask = self.copy, self.hash, self.place, self._mask
        i = ((h ^ self._salt ^ (((place << 16) | copy) * _PLACE_MIX & _MASK64)) * _MIX & _MASK64) >> self._shift
        while True:  # the line above is _home, inlined: find is the ledger's most frequent call
            c = copies[i]
            if c == EMPTY:
                return NONE
            if c == copy and hashes[i] == h and places[i] == place:
                return i
            i = (i + 1) & mask

    def insert(self, place: int, h: int, copy: int, block_id: int) -> int:
        """A new entry (absent, and used < capacity: the caller made room); a hash's entry is the most recent."""
        assert self.used < self.capacity
        i, copies, mask = self._home(place, h, copy), self.copy, self._mask
        while copies[i] != EMPTY:
            i = (i + 1) & mask
        self.hash[i], self.block[i], self.place[i], self.copy[i], self.live[i] = h, block_id, place, copy, 0
        self.used += 1
        if copy == 0:
            self._link_last(i)
        else:
            self.copies_held += 1
        return i

    def touch(self, i: int) -> None:
        """A hash's entry becomes the most recent."""
        if i != self.tail:
            self._unlink(i)
            self._link_last(i)

    def evict_oldest(self) -> tuple[int, int, int]:
        """Forget the least recent hash and its copies: (hash, its live copies, entries freed)."""
        i = self.head
        place, h, live = self.place[i], self.hash[i], self.live[i]
        freed, copy = 0, 1
        while self.copies_held and (j := self.find(place, h, copy)) != NONE:  # copies 1.. were made in order: stop at the first gap
            self._delete(j)
            freed, copy = freed + 1, copy + 1
        self._delete(self.find(place, h, 0) if freed else i)  # looked up again: a deletion may have moved it
        return h, live, freed + 1

    def live_entries(self) -> Iterator[int]:
        """Slots of hashes with live copies, least recent first."""
        i = self.head
        while i != NONE:
            nxt = self.next[i]
            if self.live[i]:
                yield i
            i = nxt

    # -- the recency list and deletion ------------------------------------------------------------
    def _link_last(self, i: int) -> None:
        self.prev[i], self.next[i] = self.tail, NONE
        if self.tail == NONE:
            self.head = i
        else:
            self.next[self.tail] = i
        self.tail = i

    def _unlink(self, i: int) -> None:
        p, n = self.prev[i], self.next[i]
        self._point(p, n, n, p)

    def _point(self, p: int, n: int, after_p: int, before_n: int) -> None:
        """Slot p's successor becomes after_p and slot n's predecessor before_n (NONE: the list's ends)."""
        if p == NONE:
            self.head = after_p
        else:
            self.next[p] = after_p
        if n == NONE:
            self.tail = before_n
        else:
            self.prev[n] = before_n

    def _delete(self, i: int) -> None:
        """Free slot i, moving back each later entry of the run whose home is not after i (so that every
        entry stays reachable from its home without passing a free slot)."""
        if self.copy[i] == 0:
            self._unlink(i)
        else:
            self.copies_held -= 1
        mask, j = self._mask, i
        while True:
            j = (j + 1) & mask
            c = self.copy[j]
            if c == EMPTY:
                break
            home = self._home(self.place[j], self.hash[j], c)
            if (j - home) & mask >= (j - i) & mask:  # home is cyclically at or before i: may move to i
                self._move(j, i)
                i = j
        self.copy[i], self.live[i] = EMPTY, 0
        self.used -= 1

    def _move(self, src: int, dst: int) -> None:
        self.hash[dst], self.block[dst], self.place[dst] = self.hash[src], self.block[src], self.place[src]
        self.copy[dst], self.live[dst] = self.copy[src], self.live[src]
        if self.copy[src] != 0:
            return
        p, n = self.prev[src], self.next[src]
        self.prev[dst], self.next[dst] = p, n
        self._point(p, n, dst, dst)
