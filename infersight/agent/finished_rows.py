"""FinishedRows: the last `maxlen` finished requests' rows, oldest first, as a read-only sequence of dicts.

The ledger builds one frame of rows per poll; turning every row into a dict costs ms per poll,
and most polls nobody reads the rows. So the frames are kept (shallow copies: pandas' copy-on-write
keeps them as they were when added) and each is turned into dicts, once, when first read.
"""
from __future__ import annotations

from collections import deque
from typing import Iterator

import pandas as pd


def row_dicts(rows: pd.DataFrame) -> list[dict[str, object]]:
    """rows as dicts of Python values, as to_dict("records") gives them (at a third of its cost)."""
    columns = list(rows.columns)
    return [dict(zip(columns, values)) for values in zip(*(rows[c].tolist() for c in columns))]


class FinishedRows:
    """A bounded, oldest-first sequence of row dicts (what a deque(maxlen=...) of them would hold)."""

    def __init__(self, maxlen: int) -> None:
        self.maxlen = max(0, int(maxlen))
        self._chunks: deque[list] = deque()  # [frame, its dicts or None]
        self._rows = 0  # rows in the chunks
        self._skip = 0  # rows of the first chunk already pushed out by newer ones

    def extend_frame(self, rows: pd.DataFrame) -> None:
        """Append the rows of `rows` (kept as a snapshot); the oldest beyond maxlen fall out."""
        if len(rows) == 0:
            return
        self._chunks.append([rows.copy(deep=False), None])
        self._rows += len(rows)
        while self._chunks and self._rows - len(self._chunks[0][0]) >= self.maxlen:
            self._rows -= len(self._chunks.popleft()[0])
        self._skip = max(0, self._rows - self.maxlen)

    def frames(self) -> Iterator[pd.DataFrame]:
        """The kept rows as frames, oldest first (the first one trimmed to what is kept)."""
        for i, (frame, _) in enumerate(self._chunks):
            yield frame.iloc[self._skip:] if i == 0 and self._skip else frame

    def __len__(self) -> int:
        return self._rows - self._skip

    def __iter__(self) -> Iterator[dict[str, object]]:
        for i, chunk in enumerate(list(self._chunks)):
            if chunk[1] is None:
                chunk[1] = row_dicts(chunk[0])
            yield from (chunk[1][self._skip:] if i == 0 and self._skip else chunk[1])

    def __getitem__(self, index: int) -> dict[str, object]:
        return list(self)[index]

    def __bool__(self) -> bool:
        return len(self) > 0
