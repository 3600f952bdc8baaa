"""The static inputs of the decode graphs (part of runtime.cuda_graphs): one decode row per
sequence, and the pinned host staging buffer with its device twin that the graphs read.

    [ input_ids | positions | slot_mapping | context_lens ]  max_batch each
    [ block tables, row-major [bucket, width] ]               max_batch * max_blocks
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import torch

from infersight.runtime.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from infersight.runtime.request import Request


class DecodeFeed(Protocol):
    """What a step feeds for one request (model_runner.FeedItem; a protocol to keep imports one-way)."""

    req: "Request"
    start_pos: int
    tokens: list[int]
    logits: int


@dataclass
class DecodeRow:
    """One sequence's single-token decode, written out (tests and tools build steps from these)."""

    token: int
    position: int
    slot: int
    blocks: list[int]  # the block table up to the last block holding context


@dataclass
class DecodeRows:
    """The rows of a pure decode step as parallel lists, one entry per sequence: no object per row,
    and no copy of any block table (a step of 32 sequences is built in a few microseconds)."""

    tokens: list[int]
    positions: list[int]
    slots: list[int]
    tables: list[list[int]]  # each request's block table itself: tables only grow in place (see fill)
    n_blocks: list[int]      # blocks holding context: tables[i][:n_blocks[i]]

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_blocks(self) -> int:
        return max(self.n_blocks, default=0)

    def blocks(self, i: int) -> list[int]:
        return self.tables[i][:self.n_blocks[i]]

    @classmethod
    def of(cls, rows: Sequence[DecodeRow]) -> "DecodeRows":
        return cls([r.token for r in rows], [r.position for r in rows], [r.slot for r in rows],
                   [r.blocks for r in rows], [len(r.blocks) for r in rows])


def decode_rows(items: Sequence[DecodeFeed], block_size: int) -> DecodeRows | None:
    """The rows of a pure decode step (every item one token, its logits wanted); else None."""
    tokens: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    tables: list[list[int]] = []
    n_blocks: list[int] = []
    for item in items:
        fed = item.tokens
        if len(fed) != 1 or item.logits != 1:
            return None
        pos = item.start_pos
        table = item.req.block_table
        block = pos // block_size
        tokens.append(fed[0])
        positions.append(pos)
        slots.append(table[block] * block_size + pos % block_size)
        tables.append(table)
        n_blocks.append(block + 1)
    return DecodeRows(tokens, positions, slots, tables, n_blocks)


class DecodeInputs:
    """The static input buffers (host staging and device) and the ForwardBatch views on them."""

    def __init__(self, max_batch: int, max_blocks: int, block_size: int, pad_block: int, device: str) -> None:
        self.max_batch, self.max_blocks = max_batch, max_blocks
        self.pad_block, self.pad_slot = pad_block, pad_block * block_size
        size = 4 * max_batch + max_batch * max_blocks
        pin = device.startswith("cuda")
        self.host = torch.zeros(size, dtype=torch.long, pin_memory=pin)
        self.device_buf = torch.zeros(size, dtype=torch.long, device=device)
        self._np = self.host.numpy()
        # One event, re-recorded after each copy: fill waits on it before overwriting the host buffer.
        self._ready: torch.cuda.Event | None = torch.cuda.Event() if self.device_buf.is_cuda else None
        # (the block table list, how many of its blocks) each table row of the host buffer holds
        # (None: unknown), for the current width.
        self._rows_written: list[tuple[list[int], int] | None] = [None] * max_batch
        self._rows_width = 0
        self.arange = torch.arange(max_batch, dtype=torch.long, device=device)

    def _fields(self, buf: torch.Tensor) -> list[torch.Tensor]:
        m = self.max_batch
        return [buf[i * m:(i + 1) * m] for i in range(4)]

    def batch(self, bucket: int, width: int, expert_counts: torch.Tensor | None = None) -> ForwardBatch:
        """The ForwardBatch a (bucket, width) graph is captured on: views of the device buffer."""
        ids, pos, slots, lens = (f[:bucket] for f in self._fields(self.device_buf))
        tables = self.device_buf[4 * self.max_batch:4 * self.max_batch + bucket * width].view(bucket, width)
        index = self.arange[:bucket]
        return ForwardBatch(input_ids=ids, positions=pos, slot_mapping=slots, segments=[], decode_index=index,
                            decode_block_tables=tables, decode_context_lens=lens, logits_index=index,
                            expert_counts=expert_counts)

    def fill(self, rows: DecodeRows | Sequence[DecodeRow], bucket: int, width: int, copy: bool = True) -> None:
        """Write rows (padded to bucket) into the host buffer and (copy) start the copy to the device;
        copy=False for a graph that copies its inputs itself (copy_in, captured).

        A row whose table (the same list object) was written before is not written again, or only
        its new blocks: a request's block table only grows in place (kv_cache.allocate_slots); any
        other change gives the request a new list (admit, free, swap_in). The list is kept, so its
        identity cannot be reused by another table."""
        if not isinstance(rows, DecodeRows):
            rows = DecodeRows.of(rows)
        if self._ready is not None:
            self._ready.synchronize()  # the previous copy has read the host buffer (no-op before the first)
        n, m, buf = len(rows), self.max_batch, self._np
        buf[:n] = rows.tokens
        buf[m:m + n] = rows.positions
        buf[2 * m:2 * m + n] = rows.slots
        buf[3 * m:3 * m + n] = buf[m:m + n] + 1  # context lengths
        buf[n:bucket], buf[m + n:m + bucket], buf[2 * m + n:2 * m + bucket], buf[3 * m + n:3 * m + bucket] = (
            0, 0, self.pad_slot, 1)
        tables = buf[4 * m:4 * m + bucket * width].reshape(bucket, width)
        written = self._rows_written
        if width != self._rows_width:  # another row layout: nothing written is where it was
            written[:] = [None] * m
            self._rows_width = width
        for i, (table, nb) in enumerate(zip(rows.tables, rows.n_blocks)):
            # A row's table grows by one block every block_size steps: most steps it is already there.
            # Columns past a row's context are never read by the kernel: they may hold stale ids.
            known = written[i]
            if known is not None and known[0] is table:
                if known[1] >= nb:
                    continue
                tables[i, known[1]:nb] = table[known[1]:nb]
            else:
                tables[i, :nb] = table[:nb]
            written[i] = (table, nb)
        tables[n:, 0] = self.pad_block
        written[n:bucket] = [None] * (bucket - n)
        if copy:
            self.copy_in(bucket, width)
            if self._ready is not None:
                self._ready.record()

    def copy_in(self, bucket: int, width: int) -> None:
        """The host buffer's (bucket, width) part to the device buffer, asynchronously."""
        end = 4 * self.max_batch + bucket * width
        self.device_buf[:end].copy_(self.host[:end], non_blocking=True)
