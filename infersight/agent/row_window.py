"""RowWindow: the last rows of a stream of frames, bounded in rows and in bytes, kept as few frames.

Appending a poll's rows costs a list append, not a concatenation of the whole window every poll.
But a DataFrame costs about 10 KB of its own whatever its rows (block manager, index, one block a
dtype): a one-row request row is ~20x its data. At about one request a poll, an agent that kept
each poll's frame held mostly frame overhead, and its memory grew by ~36 KB a request (issue 33).
So recent frames wait in a tail and are joined into one chunk once COMPACT_FRAMES of them (or
COMPACT_ROWS rows) wait; the window is a short deque of chunks:

    chunks (joined, bytes measured once)             tail (as appended)
    [ c0: skip | kept rows ] [ c1 ] ... [ cn ]        [ f ] [ f ] ... (< COMPACT_FRAMES)
      ^ oldest: its first `skip` rows are outside the row limit (a view: freed with the chunk)

Bounds: at most `limit` rows visible; at most `max_bytes` held, counted as frame_bytes (the data:
columns, index, the Python objects of object columns), whole pieces at a time, oldest first: a
piece's memory is freed only when the piece goes, so a piece counts in full until then. What is
not counted: each held frame's own bookkeeping (~10 KB: at most ~COMPACT_FRAMES tail frames plus
one per chunk) and the joined frame() while one is cached.
"""
from __future__ import annotations

from collections import deque
from typing import Iterator

import pandas as pd

from infersight.correlate.frames import concat_frames

#: Frames (or rows) the tail holds before it is joined into a chunk.
COMPACT_FRAMES = 64
COMPACT_ROWS = 4096


def frame_bytes(frame: pd.DataFrame) -> int:
    """Bytes of a frame's data: every column and the index, the Python objects of object columns
    included (pandas' deep memory_usage)."""
    return int(frame.memory_usage(index=True, deep=True).sum())


class RowWindow:
    """The last rows appended (in order), at most `limit` of them and `max_bytes` held (None: no
    byte bound), as one frame with a fresh RangeIndex on demand."""

    def __init__(self, empty: pd.DataFrame, limit: int, max_bytes: int | None = None) -> None:
        self.limit, self.max_bytes = limit, max_bytes
        self._empty = empty
        self._pieces: deque[list] = deque()  # [frame, rows, bytes]: chunks, then the tail's frames
        self._tail = 0  # how many of the last pieces are tail frames (not joined yet)
        self._tail_rows = 0
        self._rows = 0  # rows held (including the skipped ones)
        self._bytes = 0  # bytes held (frame_bytes of every piece)
        self._skip = 0  # rows of the oldest piece outside the row limit
        self._joined: pd.DataFrame | None = empty
        self.evicted_rows = 0  # rows that left the window, by either bound

    def __len__(self) -> int:
        return self._rows - self._skip

    @property
    def empty(self) -> bool:
        return len(self) == 0

    @property
    def held_bytes(self) -> int:
        """Bytes of every piece held (the bound applies to this)."""
        return self._bytes

    @property
    def pieces(self) -> int:
        """Frames held: the chunks and the tail."""
        return len(self._pieces)

    def append(self, frame: pd.DataFrame) -> None:
        if frame.empty:
            return
        self._pieces.append([frame, len(frame), frame_bytes(frame)])
        self._tail += 1
        self._tail_rows += len(frame)
        self._rows += len(frame)
        self._bytes += self._pieces[-1][2]
        if self._tail >= COMPACT_FRAMES or self._tail_rows >= COMPACT_ROWS:
            self._compact()
        self._trim()
        self._joined = None

    def _compact(self) -> None:
        """Join the tail's frames into one chunk (the skipped rows of an oldest tail frame go first)."""
        if self._tail == len(self._pieces) and self._skip:
            self._drop_skipped()
        parts = [self._pieces.pop() for _ in range(self._tail)][::-1]
        chunk = concat_frames([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        size = frame_bytes(chunk)
        self._bytes += size - sum(p[2] for p in parts)
        self._pieces.append([chunk, len(chunk), size])
        self._tail = self._tail_rows = 0

    def _drop_skipped(self) -> None:
        first = self._pieces[0]
        first[0] = first[0].iloc[self._skip:].reset_index(drop=True).copy()
        self._rows -= self._skip
        first[1] = len(first[0])
        size = frame_bytes(first[0])
        self._bytes += size - first[2]
        first[2] = size
        self._skip = 0

    def _trim(self) -> None:
        while self._pieces and (self._rows - self._pieces[0][1] >= self.limit
                                or self.max_bytes is not None and self._bytes > self.max_bytes):
            frame, rows, size = self._pieces.popleft()
            self.evicted_rows += rows - self._skip
            self._rows -= rows
            self._bytes -= size
            self._skip = 0
            if self._tail > len(self._pieces):  # the popped piece was a tail frame
                self._tail -= 1
                self._tail_rows -= rows
        skip = max(0, self._rows - self.limit)
        self.evicted_rows += skip - self._skip
        self._skip = skip

    def frames(self) -> Iterator[pd.DataFrame]:
        """The window's rows as frames, oldest first (the first trimmed to the row limit)."""
        for i, (frame, _, _) in enumerate(self._pieces):
            yield frame.iloc[self._skip:] if i == 0 and self._skip else frame

    def frame(self) -> pd.DataFrame:
        """The window as one frame (index 0 .. len - 1); the same object until the next append."""
        if self._joined is None:
            parts = list(self.frames())
            self._joined = concat_frames(parts) if parts else self._empty
        return self._joined

    def rows_of(self, column: str, values: object) -> pd.DataFrame:
        """frame()[frame()[column].isin(values)] (index aside), without joining the window first."""
        if self._joined is not None:
            joined = self._joined
            return joined[joined[column].isin(values)]
        parts = [f[f[column].isin(values)] for f in self.frames()]
        kept = [part for part in parts if not part.empty]
        return concat_frames(kept) if kept else (parts[0] if parts else self._empty)
