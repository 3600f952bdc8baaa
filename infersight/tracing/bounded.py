"""Tables the tracing hook keeps between probe batches, bounded in entries and in (estimated) bytes.

Each table forgets its oldest entries (insertion order) beyond either limit, and counts each one it
forgot in a shared Evictions by (table name, reason): `entries` or `bytes`. The sizes are estimates
of what an entry holds in memory (a caller's `size` per value or per appended item), so a table's
byte limit bounds the agent's resident memory, not an encoding.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from typing import Any, Callable, Generic, Iterator, TypeVar


K = TypeVar("K")
V = TypeVar("V")
#: Per-object overheads (CPython 3.11, 64-bit) used by the estimates below.
DICT_ENTRY = 100
TUPLE_ITEM = 80
INT_ITEM = 32
STR_ITEM = 50


class Evictions:
    """Entries forgotten, by (table, reason); shared by the tables of one hook."""

    def __init__(self) -> None:
        self._counts: defaultdict[tuple[str, str], int] = defaultdict(int)
        self._lock = threading.Lock()

    def add(self, table: str, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[(table, reason)] += n

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


class BoundedTable(Generic[K, V]):
    """An insertion-ordered dict with at most max_entries entries and max_bytes estimated bytes."""

    def __init__(self, name: str, evictions: Evictions, max_entries: int, max_bytes: int) -> None:
        self.name, self.evictions = name, evictions
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._data: OrderedDict[K, V] = OrderedDict()  # popping the oldest of a plain dict is O(holes)
        self._sizes: dict[K, int] = {}
        self.bytes = 0
        self._evicted: list[K] = []  # keys forgotten since the last evicted() call

    def put(self, key: K, value: V, size: int) -> None:
        """Set key (replacing its value and size; a new key goes last), then enforce the limits."""
        self.bytes += size - self._sizes.get(key, 0)
        self._data[key] = value
        self._sizes[key] = size
        self._enforce()

    def append(self, key: K, item: Any, size: int) -> None:
        """Append item to key's list (created empty), adding size to the entry's bytes."""
        values = self._data.get(key)
        if values is None:
            values = self._data[key] = []  # type: ignore[assignment]
            self._sizes[key] = DICT_ENTRY
            self.bytes += DICT_ENTRY
        values.append(item)  # type: ignore[attr-defined]
        self._sizes[key] += size
        self.bytes += size
        self._enforce()

    def get(self, key: K, default: Any = None) -> Any:
        return self._data.get(key, default)

    def pop(self, key: K, default: Any = None) -> Any:
        if key not in self._data:
            return default
        self.bytes -= self._sizes.pop(key)
        return self._data.pop(key)

    def popitem_oldest(self) -> tuple[K, V]:
        key, value = self._data.popitem(last=False)
        self.bytes -= self._sizes.pop(key)
        return key, value

    def evicted(self) -> list[K]:
        """The keys forgotten for the limits since the last call (so an owner can release what
        they referred to elsewhere); cleared by the call."""
        out, self._evicted = self._evicted, []
        return out

    def clear(self) -> None:
        self._data.clear()
        self._sizes.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def items(self) -> Iterator[tuple[K, V]]:
        return iter(self._data.items())

    def over(self) -> str | None:
        """Which limit the table is over now ('entries', 'bytes'), or None."""
        if len(self._data) > self.max_entries:
            return "entries"
        if self.bytes > self.max_bytes and len(self._data) > 1:  # the newest entry always stays
            return "bytes"
        return None

    def _enforce(self, on_evict: Callable[[K, V], None] | None = None) -> None:
        while (reason := self.over()) is not None:
            key, value = self.popitem_oldest()
            self.evictions.add(self.name, reason)
            if len(self._evicted) < 1024:  # an owner that never asks cannot grow this without bound
                self._evicted.append(key)
            if on_evict is not None:
                on_evict(key, value)


def record_bytes(record: dict[str, Any]) -> int:
    """A record dict's estimated memory: per-key overhead plus its strings."""
    return sum(DICT_ENTRY + (len(v) if isinstance(v, (str, bytes)) else 8) for v in record.values())
