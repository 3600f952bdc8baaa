"""FinishedRows: the last finished requests' rows, oldest first, bounded in rows and in bytes.

The ledger builds one frame of rows per poll. They are kept as column blocks (agent.rows.row_window: one
owned array a column, blocks joined up to CHUNK_ROWS rows; a frame a poll, or frames joined, cost
5-20x their data) and read as frames by the summary, the slow-request API and the flight recorder,
built when read; dicts are built only for what is asked (iteration, indexing), never kept: a dict a
row cost ~2 KB, several times the row's data. The byte budget counts what the blocks hold
(row_window.block_bytes), not an estimate of the data.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pandas as pd

from infersight.agent.rows.row_window import RowWindow
from infersight.correlate.frames import concat_frames


def row_dicts(rows: pd.DataFrame) -> list[dict[str, object]]:
    """rows as dicts of Python values, as to_dict("records") gives them (at a third of its cost)."""
    columns = list(rows.columns)
    return [dict(zip(columns, values)) for values in zip(*(rows[c].tolist() for c in columns))]


class FinishedRows:
    """A bounded, oldest-first sequence of request rows: at most `maxlen` rows and `max_bytes`
    bytes of row data held (None: no byte bound), the oldest going first (row_window)."""

    def __init__(self, maxlen: int, max_bytes: int | None = None) -> None:
        self.maxlen = max(0, int(maxlen))
        self.max_bytes = max_bytes
        self._window = RowWindow(pd.DataFrame(), self.maxlen, max_bytes)

    def extend_frame(self, rows: pd.DataFrame) -> None:
        """Append the rows of `rows` (copied: a later change to `rows` is not seen); the oldest beyond
        the bounds fall out."""
        self._window.append(rows)

    def frames(self) -> Iterator[pd.DataFrame]:
        """The kept rows as frames, oldest first."""
        return self._window.frames()

    def frame(self) -> pd.DataFrame:
        """The kept rows as one new frame (index 0 .. len - 1; no columns when none are kept). Not
        cached: a cached copy would double what retention keeps."""
        return self._window.join()

    def tail(self, n: int) -> pd.DataFrame:
        """The last n kept rows as one new frame (joining only the frames that hold them)."""
        parts: list[pd.DataFrame] = []
        rows = 0
        for frame in self._window.newest_frames():
            if rows >= n:
                break
            parts.append(frame)
            rows += len(frame)
        return concat_frames(parts[::-1]).iloc[-n:].reset_index(drop=True) if parts and n > 0 else pd.DataFrame()

    def last_values(self, column: str, n: int) -> np.ndarray:
        """The last n kept rows' values of one column, oldest first (no frame built)."""
        return self._window.last_values(column, n)

    @property
    def held_bytes(self) -> int:
        """Bytes held for the kept rows (row_window.block_bytes of every block): <= max_bytes."""
        return self._window.held_bytes

    @property
    def evicted(self) -> int:
        """Rows that fell out, by either bound."""
        return self._window.evicted_rows

    def __len__(self) -> int:
        return len(self._window)

    def __iter__(self) -> Iterator[dict[str, object]]:
        for frame in list(self._window.frames()):
            yield from row_dicts(frame)

    def __getitem__(self, index: int) -> dict[str, object]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(index)
        return row_dicts(self.tail(n - index % n).iloc[:1])[0]

    def __bool__(self) -> bool:
        return len(self) > 0
