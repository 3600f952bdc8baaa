"""The static inputs of the decode graphs (part of runtime.runner.cuda_graphs): one decode row per
sequence, and the pinned host staging buffer with its device twin that the graphs read.

    [ input_ids | positions | slot_mapping | context_lens | token_src ]  max_batch each
    [ block tables, row-major [bucket, width] ]                           max_batch * max_blocks

token_src is read only by the graphs of an engine with async scheduling (runtime.engine.async_steps): a
row >= 0 takes its input token from that row of the step still running on the device, -1 the
token written here. Such an engine keeps two staging buffers and alternates between them, so
filling the next step never waits for the copy of the step in flight.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import torch

from infersight.runtime.model.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from infersight.runtime.engine.request import Request


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
    src: list[int] | None = None  # per row, its token's row in the step in flight (-1: tokens[i]); async only

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

    FIELDS = 5  # input_ids, positions, slot_mapping, context_lens, token_src

    def __init__(self, max_batch: int, max_blocks: int, block_size: int, pad_block: int, device: str,
                 staging: int = 1) -> None:
        self.max_batch, self.max_blocks = max_batch, max_blocks
        self.pad_block, self.pad_slot = pad_block, pad_block * block_size
        self.table_at = self.FIELDS * max_batch
        size = self.table_at + max_batch * max_blocks
        pin = device.startswith("cuda")
        self.device_buf = torch.zeros(size, dtype=torch.long, device=device)
        self._stages = [_Staging(size, max_batch, pin, self.device_buf.is_cuda) for _ in range(staging)]
        self.async_steps = staging > 1  # only async graphs read token_src: the synchronous fill skips it
        self._turn = 0
        self.arange = torch.arange(max_batch, dtype=torch.long, device=device)

    @property
    def host(self) -> torch.Tensor:
        """The staging buffer the next fill writes (the only one without async scheduling)."""
        return self._stages[self._turn].host

    def _fields(self, buf: torch.Tensor) -> list[torch.Tensor]:
        m = self.max_batch
        return [buf[i * m:(i + 1) * m] for i in range(self.FIELDS)]

    def token_src(self, bucket: int) -> torch.Tensor:
        """The device view of token_src for a (bucket, ·) graph (see the module docstring)."""
        return self._fields(self.device_buf)[4][:bucket]

    def batch(self, bucket: int, width: int, expert_counts: torch.Tensor | None = None) -> ForwardBatch:
        """The ForwardBatch a (bucket, width) graph is captured on: views of the device buffer."""
        ids, pos, slots, lens, _ = (f[:bucket] for f in self._fields(self.device_buf))
        tables = self.device_buf[self.table_at:self.table_at + bucket * width].view(bucket, width)
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
        self._turn = (self._turn + 1) % len(self._stages)
        stage = self._stages[self._turn]
        if stage.ready is not None:
            stage.ready.synchronize()  # the last copy from this buffer has read it (no-op before the first)
        n, m, buf = len(rows), self.max_batch, stage.np
        buf[:n] = rows.tokens
        buf[m:m + n] = rows.positions
        buf[2 * m:2 * m + n] = rows.slots
        buf[3 * m:3 * m + n] = buf[m:m + n] + 1  # context lengths
        if self.async_steps:
            buf[4 * m:4 * m + n] = -1 if rows.src is None else rows.src
            buf[4 * m + n:4 * m + bucket] = -1
        buf[n:bucket], buf[m + n:m + bucket], buf[2 * m + n:2 * m + bucket], buf[3 * m + n:3 * m + bucket] = (
            0, 0, self.pad_slot, 1)
        tables = buf[self.table_at:self.table_at + bucket * width].reshape(bucket, width)
        written = stage.rows_written
        if width != stage.rows_width:  # another row layout: nothing written is where it was
            written[:] = [None] * m
            stage.rows_width = width
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
            if stage.ready is not None:
                stage.ready.record()

    def copy_in(self, bucket: int, width: int) -> None:
        """The current staging buffer's (bucket, width) part to the device buffer, asynchronously."""
        end = self.table_at + bucket * width
        self.device_buf[:end].copy_(self.host[:end], non_blocking=True)


class _Staging:
    """One pinned host staging buffer, the event after its last copy, and which table rows it holds."""

    def __init__(self, size: int, max_batch: int, pin: bool, cuda: bool) -> None:
        self.host = torch.zeros(size, dtype=torch.long, pin_memory=pin)
        self.np = self.host.numpy()
        # Re-recorded after each copy: fill waits on it before overwriting this buffer.
        self.ready: torch.cuda.Event | None = torch.cuda.Event() if cuda else None
        # (the block table list, how many of its blocks) each table row of this buffer holds
        # (None: unknown), for rows_width.
        self.rows_written: list[tuple[list[int], int] | None] = [None] * max_batch
        self.rows_width = 0
