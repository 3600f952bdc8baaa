"""The flight recorder's memory: the last window summaries, in memory and (optionally) on disk,
both bounded by count and by bytes. The oldest go first.

On disk each summary is one file, `window-<seq>.json` (seq zero-padded, so names sort by age),
written to a temporary name and renamed, so a reader never sees half a file. Files already in the
directory when the store opens count against the bounds (a restarted agent does not grow it), and
their measured costs are what a restarted recorder starts its budget from (`kept_costs`).
A value JSON cannot hold (NaN or an infinity: a roofline fraction of a category with no modelled
bytes) is kept as None (null), in memory too, so that what is served equals what is on disk.
"""
from __future__ import annotations

import json
import logging
import math
import os
from collections import deque
from pathlib import Path
from typing import Any

log = logging.getLogger("infersight.agent")
PREFIX, SUFFIX = "window-", ".json"


class WindowStore:
    """keep: summaries kept (memory and disk); max_bytes: bytes kept (each side, JSON size)."""

    def __init__(self, keep: int = 256, max_bytes: int = 16 << 20, directory: str | Path | None = None) -> None:
        if keep < 1 or max_bytes < 1:
            raise ValueError(f"the recorder keeps >= 1 window and >= 1 byte, got {keep}, {max_bytes}")
        self.keep, self.max_bytes = keep, max_bytes
        self._memory: deque[tuple[dict[str, Any], int]] = deque()
        self._bytes = 0
        self.directory = Path(directory) if directory else None
        self._files: deque[tuple[Path, int]] = deque()
        self._disk_bytes = 0
        self.write_errors = 0
        self._seq = 0
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            for path in sorted(self.directory.glob(PREFIX + "*" + SUFFIX)):
                self._files.append((path, path.stat().st_size))
                self._disk_bytes += path.stat().st_size
                stem = path.name[len(PREFIX):-len(SUFFIX)]
                self._seq = max(self._seq, int(stem) if stem.isdigit() else 0)
            self._prune_disk()

    def add(self, summary: dict[str, Any]) -> None:
        """Keep one window's summary (JSON-able), forgetting the oldest beyond the bounds."""
        summary = _json_safe(summary)
        text = json.dumps(summary, separators=(",", ":"), allow_nan=False, default=str)
        size = len(text.encode())
        self._memory.append((summary, size))
        self._bytes += size
        while len(self._memory) > self.keep or (self._bytes > self.max_bytes and len(self._memory) > 1):
            self._bytes -= self._memory.popleft()[1]
        if self.directory is not None:
            self._write(text, size)

    def _write(self, text: str, size: int) -> None:
        assert self.directory is not None
        self._seq += 1
        path = self.directory / f"{PREFIX}{self._seq:010d}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, path)
        except OSError as exc:
            self.write_errors += 1
            log.warning("flight recorder: cannot write %s (%s)", path, exc.strerror or exc)
            return
        self._files.append((path, size))
        self._disk_bytes += size
        self._prune_disk()

    def _prune_disk(self) -> None:
        while self._files and (len(self._files) > self.keep or self._disk_bytes > self.max_bytes):
            path, size = self._files.popleft()
            self._disk_bytes -= size
            try:
                path.unlink()
            except OSError:
                pass

    def kept_costs(self, n: int) -> list[float]:
        """The measured costs (seconds) of the last n sampled windows kept on disk, oldest first: what an
        earlier run of the recorder found windows cost on this engine (WindowBudget.seed). Windows
        settled at an estimate, triggered captures and unreadable files are left out."""
        costs: list[float] = []
        for path, _ in reversed(self._files):
            if len(costs) >= n:
                break
            try:
                entry = json.loads(path.read_text())
                cost = float(entry["cost"]["cost_s"]) if entry.get("kind") == "window" and entry.get("cost") else None
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if cost is not None and math.isfinite(cost):
                costs.append(cost)
        return costs[::-1]

    def recent(self, n: int | None = None) -> list[dict[str, Any]]:
        """The last n summaries (all kept when None), oldest first."""
        items = [s for s, _ in self._memory]
        return items if n is None else items[-n:] if n > 0 else []

    def stats(self) -> dict[str, int]:
        return {"windows": len(self._memory), "bytes": self._bytes, "disk_files": len(self._files),
                "disk_bytes": self._disk_bytes, "write_errors": self.write_errors}


def _json_safe(value: Any) -> Any:
    """value with every non-finite float replaced by None (dicts, lists and tuples walked)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
