"""RowWindow: the last N rows of a stream of frames, kept as the frames themselves.

Appending a poll's rows costs a deque append (and, past the limit, dropping or slicing the oldest
frames), not a concatenation of the whole window every poll. `frame()` concatenates once per change;
`rows_of` filters frame by frame, for callers that need a few requests' rows of the window every poll.
"""
from __future__ import annotations

from collections import deque

import pandas as pd

from infersight.correlate.frames import concat_frames


class RowWindow:
    """The last `limit` rows appended (in order), as one frame with a fresh RangeIndex on demand."""

    def __init__(self, empty: pd.DataFrame, limit: int) -> None:
        self.limit = limit
        self._empty = empty
        self._frames: deque[pd.DataFrame] = deque()
        self._rows = 0
        self._joined: pd.DataFrame | None = empty

    def __len__(self) -> int:
        return self._rows

    @property
    def empty(self) -> bool:
        return self._rows == 0

    def append(self, frame: pd.DataFrame) -> None:
        if frame.empty:
            return
        self._frames.append(frame)
        self._rows += len(frame)
        while self._rows - len(self._frames[0]) >= self.limit:
            self._rows -= len(self._frames.popleft())
        if self._rows > self.limit:  # the oldest frame is partly outside the window
            self._frames[0] = self._frames[0].iloc[self._rows - self.limit:]
            self._rows = self.limit
        self._joined = None

    def frame(self) -> pd.DataFrame:
        """The window as one frame (index 0 .. len - 1); the same object until the next append."""
        if self._joined is None:
            self._joined = concat_frames(list(self._frames))
        return self._joined

    def rows_of(self, column: str, values: object) -> pd.DataFrame:
        """frame()[frame()[column].isin(values)] (index aside), without joining the window first."""
        if self._joined is not None:
            joined = self._joined
            return joined[joined[column].isin(values)]
        parts = [f[f[column].isin(values)] for f in self._frames]
        kept = [part for part in parts if not part.empty]
        return concat_frames(kept) if kept else parts[0]
