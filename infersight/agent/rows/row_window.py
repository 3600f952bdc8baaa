"""RowWindow: the last rows of a stream of frames, bounded in rows and in bytes, kept as column blocks.

A pandas DataFrame costs about 10 KB of its own whatever its rows (block manager, index, one block
a dtype), and a frame joined from others keeps more of it (pandas' internal caches, block
placements). Measured with tracemalloc (issue 33), the finished requests' rows kept as frames joined
64 polls at a time held 11.5x the row data their budget counted: 4.9 KB a row where the data is
0.4 KB. So the window keeps no frames: each appended frame becomes one column block (one owned
numpy array a column, nothing else), recent blocks are joined into larger ones (up to CHUNK_ROWS
rows, in a binary-counter pattern so that each row is copied O(log) times), and a frame is built
only when one is read:

    blocks (each: {column: ndarray}, its rows, its bytes)
    [ b0: skip | kept rows ] [ b1 ] ... [ bn ]
      ^ oldest: its first `skip` rows are outside the row limit (freed with the block)

Bounds: at most `limit` rows visible; at most `max_bytes` held, whole blocks at a time, oldest
first. The bytes counted are what the process holds for a block (block_bytes): each array with its
header (sys.getsizeof of an owning array), the block's dict, and every distinct Python object an
object column points to (equal strings of one block are made one object first). A block's memory
is freed only when the block goes, so it counts in full until then. Not counted: the few hundred
bytes of each block's list entry, and the joined frame() while one is cached.
"""
from __future__ import annotations

import sys
from collections import deque
from typing import Iterator

import numpy as np
import pandas as pd

from infersight.correlate.frames import concat_frames

#: A block grows by joining to at most this many rows: the oldest block is what the byte bound drops at
#: once (at ~0.35 KB a finished request, 1,024 rows are ~4% of the default 8 MiB budget).
CHUNK_ROWS = 1024
#: ... and to at most this fraction of a byte budget (a small budget is not dropped half at a time).
BLOCKS_PER_BUDGET = 16
#: Kept for the tests' piece-count bound: appended blocks are joined at least this often.
COMPACT_FRAMES = 64


def frame_bytes(frame: pd.DataFrame) -> int:
    """Bytes of a frame's data: every column and the index, the Python objects of object columns
    included (pandas' deep memory_usage)."""
    return int(frame.memory_usage(index=True, deep=True).sum())


class Block:
    """Rows of one or more appended frames: one owned array a column, the columns' dtypes as they
    came (a frame is rebuilt with them), its row count and the bytes it holds (block_bytes)."""

    __slots__ = ("columns", "dtypes", "rows", "bytes")

    def __init__(self, columns: dict[str, np.ndarray], dtypes: tuple[tuple[str, object], ...]) -> None:
        self.columns, self.dtypes = columns, dtypes
        self.rows = len(next(iter(columns.values()))) if columns else 0
        # The dtypes' tuples count too (~2 KB for 30 columns: a tenth of a one-row block); blocks
        # share them where they can (Block.of's `like`), which this count does not credit.
        self.bytes = block_bytes(columns) + _allocated(sys.getsizeof(dtypes)) + sum(
            _allocated(sys.getsizeof(pair)) for pair in dtypes)

    @classmethod
    def of(cls, frame: pd.DataFrame, like: "Block | None" = None) -> "Block":
        """A block holding copies of the frame's columns (none of the frame's memory is kept); its
        dtypes are like's object when they are equal."""
        columns = {str(name): _owned(frame[name]) for name in frame.columns}
        dtypes = tuple((str(n), d) for n, d in frame.dtypes.items())
        return cls(columns, like.dtypes if like is not None and like.dtypes == dtypes else dtypes)

    def frame(self, start: int = 0, take: np.ndarray | None = None) -> pd.DataFrame:
        """The block's rows from `start` (or the rows `take` selects) as a frame with its dtypes."""
        return pd.DataFrame({name: _series(self.columns[name][start:] if take is None else self.columns[name][take],
                                           dtype) for name, dtype in self.dtypes}, copy=False)


def _owned(column: pd.Series) -> np.ndarray:
    """The column's values in a new numpy array of its own (object for strings and other extension
    types: their Python objects are referenced, not copied)."""
    dtype = column.dtype
    if isinstance(dtype, np.dtype) and dtype != object:
        return np.array(column.to_numpy(), copy=True)
    return np.array(column.to_numpy(dtype=object, na_value=np.nan), dtype=object, copy=True)


def _series(values: np.ndarray, dtype: object) -> pd.Series:
    if isinstance(dtype, np.dtype) and values.dtype == dtype:
        return pd.Series(values, copy=False)
    return pd.Series(values, dtype=dtype)


def _interned(values: np.ndarray) -> np.ndarray:
    """The object array with equal strings made one object (in place; other objects left alone)."""
    seen: dict[str, str] = {}
    for i, v in enumerate(values.tolist()):
        if type(v) is str:
            values[i] = seen.setdefault(v, v)
    return values


def _allocated(size: int) -> int:
    """What an allocation of `size` bytes takes: Python's allocator rounds to 16 bytes."""
    return (size + 15) & ~15


#: numpy's shape and strides of each array, allocated apart from the array object (measured, tracemalloc).
ARRAY_EXTRA = 32


def block_bytes(columns: dict[str, np.ndarray]) -> int:
    """What a block holds, as allocated: each array with its header, shape and strides, the dict of
    columns, and each distinct object an object column points to (shared ones, e.g. a task name,
    counted once a block: they may also live elsewhere, so this errs high)."""
    total = _allocated(sys.getsizeof(columns)) + _allocated(sys.getsizeof(tuple(columns)))
    seen: set[int] = set()
    for values in columns.values():
        total += _allocated(sys.getsizeof(values)) + ARRAY_EXTRA
        if values.dtype == object:
            for v in values.tolist():
                if id(v) not in seen:
                    seen.add(id(v))
                    total += _allocated(sys.getsizeof(v))
    return total


def join_blocks(blocks: list[Block]) -> Block:
    """One block of the blocks' rows, in order (the same columns and dtypes: arrays joined; else through
    concat_frames, as the frames would join)."""
    first = blocks[0]
    if all(b.dtypes == first.dtypes for b in blocks):
        columns = {name: np.concatenate([b.columns[name] for b in blocks]) for name, _ in first.dtypes}
        for values in columns.values():
            if values.dtype == object:
                _interned(values)
        return Block(columns, first.dtypes)
    joined = Block.of(concat_frames([b.frame() for b in blocks]))
    for values in joined.columns.values():
        if values.dtype == object:
            _interned(values)
    joined.bytes = block_bytes(joined.columns)
    return joined


class RowWindow:
    """The last rows appended (in order), at most `limit` of them and `max_bytes` held (None: no
    byte bound), as one frame with a fresh RangeIndex on demand."""

    def __init__(self, empty: pd.DataFrame, limit: int, max_bytes: int | None = None) -> None:
        self.limit, self.max_bytes = limit, max_bytes
        # A block is what the byte bound drops at once: at most 1/BLOCKS_PER_BUDGET of the budget.
        self._block_cap = max_bytes // BLOCKS_PER_BUDGET if max_bytes is not None else None
        self._empty = empty
        self._blocks: deque[Block] = deque()
        self._rows = 0  # rows held (including the skipped ones)
        self._bytes = 0  # bytes held (block_bytes of every block)
        self._skip = 0  # rows of the oldest block outside the row limit
        self._joined: pd.DataFrame | None = empty
        self.evicted_rows = 0  # rows that left the window, by either bound

    def __len__(self) -> int:
        return self._rows - self._skip

    @property
    def empty(self) -> bool:
        return len(self) == 0

    @property
    def held_bytes(self) -> int:
        """Bytes of every block held (the bound applies to this)."""
        return self._bytes

    @property
    def pieces(self) -> int:
        """Blocks held."""
        return len(self._blocks)

    def append(self, frame: pd.DataFrame) -> None:
        if frame.empty:
            return
        block = Block.of(frame, self._blocks[-1] if self._blocks else None)
        self._blocks.append(block)
        self._rows += block.rows
        self._bytes += block.bytes
        self._join_recent()
        self._trim()
        self._joined = None

    def _join_recent(self) -> None:
        """Join the newest block into the one before while that one is no larger and both fit in
        CHUNK_ROWS and the block cap (a binary counter: O(log CHUNK_ROWS) blocks below CHUNK_ROWS rows). The oldest block
        is left alone while rows of it are skipped (its skip count would shift)."""
        blocks = self._blocks
        while len(blocks) >= 2 and not (len(blocks) == 2 and self._skip):
            prev, last = blocks[-2], blocks[-1]
            if prev.rows + last.rows > CHUNK_ROWS or (prev.rows > last.rows and len(blocks) <= COMPACT_FRAMES) \
                    or self._block_cap is not None and prev.bytes + last.bytes > self._block_cap:
                break
            joined = join_blocks([prev, last])
            blocks.pop()
            blocks[-1] = joined
            self._bytes += joined.bytes - prev.bytes - last.bytes

    def _trim(self) -> None:
        while self._blocks and (self._rows - self._blocks[0].rows >= self.limit
                                or self.max_bytes is not None and self._bytes > self.max_bytes):
            block = self._blocks.popleft()
            self.evicted_rows += block.rows - self._skip
            self._rows -= block.rows
            self._bytes -= block.bytes
            self._skip = 0
        skip = max(0, self._rows - self.limit)
        self.evicted_rows += skip - self._skip
        self._skip = skip

    def frames(self) -> Iterator[pd.DataFrame]:
        """The window's rows as frames, oldest first (the first trimmed to the row limit): each built
        now from its block."""
        for i, block in enumerate(list(self._blocks)):
            yield block.frame(self._skip if i == 0 else 0)

    def newest_frames(self) -> Iterator[pd.DataFrame]:
        """The window's rows as frames, newest first, each built only when reached: a reader of the last
        rows builds the blocks that hold them, not every block (frames() builds them all, oldest first)."""
        blocks = list(self._blocks)
        for i in range(len(blocks) - 1, -1, -1):
            yield blocks[i].frame(self._skip if i == 0 else 0)

    def last_values(self, column: str, n: int) -> np.ndarray:
        """The column's last n values (all when fewer are kept), oldest first, read from the blocks'
        arrays: no frame is built. Empty when nothing is kept or the newest rows lack the column."""
        parts: list[np.ndarray] = []
        got = 0
        blocks = list(self._blocks)
        for i in range(len(blocks) - 1, -1, -1):
            if got >= n or column not in blocks[i].columns:
                break
            values = blocks[i].columns[column][self._skip if i == 0 else 0:]
            parts.append(values)
            got += len(values)
        return np.concatenate(parts[::-1])[-n:] if parts and n > 0 else np.empty(0)

    def frame(self) -> pd.DataFrame:
        """The window as one frame (index 0 .. len - 1); the same object until the next append."""
        if self._joined is None:
            self._joined = self.join()
        return self._joined

    def join(self) -> pd.DataFrame:
        """The window as one new frame (index 0 .. len - 1), not cached; the empty frame when empty."""
        blocks = list(self._blocks)
        if not blocks:
            return self._empty
        if all(b.dtypes == blocks[0].dtypes for b in blocks):
            skip = self._skip
            return pd.DataFrame({name: _series(np.concatenate([b.columns[name][skip if i == 0 else 0:]
                                                               for i, b in enumerate(blocks)]), dtype)
                                 for name, dtype in blocks[0].dtypes}, copy=False)
        return concat_frames(list(self.frames()))

    def rows_of(self, column: str, values: object) -> pd.DataFrame:
        """frame()[frame()[column].isin(values)] (index aside), without joining the window first."""
        if self._joined is not None:
            joined = self._joined
            return joined[joined[column].isin(values)]
        wanted = np.asarray(values)
        parts = []
        for i, block in enumerate(list(self._blocks)):
            hit = np.isin(block.columns[column], wanted)
            if i == 0 and self._skip:
                hit[:self._skip] = False
            if hit.any():
                parts.append(block.frame(take=np.flatnonzero(hit)))
        if parts:
            return concat_frames(parts)
        return self._blocks[0].frame(take=np.flatnonzero(np.zeros(0, bool))) if self._blocks else self._empty
