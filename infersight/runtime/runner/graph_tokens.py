"""Greedy tokens out of a decode graph with no launch of their own (part of runtime.runner.cuda_graphs).

A replayed decode step used to cost the host four submissions besides the graph: the input copy,
an event, the argmax kernel and the device->host copy of its result. A graph captured with
in-graph I/O holds the input copy (from the pinned staging buffer, read at replay time), the
argmax of its logits and the copy of those tokens into a pinned host buffer, so a greedy step is
one launch and one wait. The engine takes the tokens with take(); a step that samples otherwise
uses the graph's logits as before, and the next replay first waits for the unread one.
"""
from __future__ import annotations

import torch


class GraphTokens:
    """The pinned host buffer the graphs copy their rows' argmax into, and whose replay it holds."""

    def __init__(self, max_batch: int) -> None:
        self.host = torch.zeros(max_batch, dtype=torch.long, pin_memory=True)
        self.rows = 0          # rows of the last replay whose tokens land in host; 0: none
        self.unread = False    # a replay may still be writing host (or reading the inputs)

    def capture(self, logits: torch.Tensor) -> None:
        """Inside a capture: the argmax of each row of logits [bucket, V], copied to host."""
        self.host[:logits.shape[0]].copy_(logits.argmax(-1), non_blocking=True)

    def replayed(self, rows: int) -> None:
        self.rows, self.unread = rows, True

    def forget(self) -> None:
        """The step ran without an in-graph copy: there are no tokens to take."""
        self.rows = 0

    def wait(self) -> None:
        """Before touching the staging buffers: the last replay is over (a no-op once it was read)."""
        if self.unread:
            torch.cuda.current_stream().synchronize()
            self.unread = False

    def take(self, rows: int) -> list[int] | None:
        """The last replay's greedy tokens for its first `rows` rows (waits for it), or None when the
        last step was not such a replay of that many rows."""
        if not rows or self.rows != rows:
            return None
        self.wait()
        self.rows = 0
        return self.host[:rows].tolist()
