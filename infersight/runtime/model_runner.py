"""Turns "feed these tokens of these requests" into a ForwardBatch and runs one model on it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from infersight.runtime.forward_batch import ForwardBatch, Segment
from infersight.runtime.model import Transformer
from infersight.runtime.request import Request


@dataclass
class FeedItem:
    """Tokens to feed for one request, starting at absolute position start_pos.

    logits: how many trailing positions need logits (0 for a prefill chunk that is not the last)."""

    req: Request
    start_pos: int
    tokens: list[int]
    logits: int


class ModelRunner:
    def __init__(self, model: Transformer, k_caches: torch.Tensor, v_caches: torch.Tensor,
                 block_size: int, device: str) -> None:
        self.model = model
        self.k_caches, self.v_caches = k_caches, v_caches
        self.block_size = block_size
        self.device = device

    def build_batch(self, items: list[FeedItem], expert_counts: torch.Tensor | None) -> ForwardBatch:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_index: list[int] = []
        segments: list[Segment] = []
        decode_index: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        for item in items:
            start = len(input_ids)
            n = len(item.tokens)
            table = item.req.block_table
            pos = range(item.start_pos, item.start_pos + n)
            input_ids += item.tokens
            positions += pos
            slots += [table[p // bs] * bs + p % bs for p in pos]
            logits_index += range(start + n - item.logits, start + n)
            context = item.start_pos + n
            if n == 1:
                decode_index.append(start)
                decode_tables.append(table[: -(-context // bs)])
                decode_lens.append(context)
            else:
                segments.append(Segment(start, n, context, torch.tensor(table, device=self.device)))
        width = max((len(t) for t in decode_tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in decode_tables]

        def as_tensor(values: list[int] | list[list[int]]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=self.device)

        return ForwardBatch(
            input_ids=as_tensor(input_ids), positions=as_tensor(positions), slot_mapping=as_tensor(slots),
            segments=segments, decode_index=as_tensor(decode_index),
            decode_block_tables=as_tensor(padded).view(len(padded), width),
            decode_context_lens=as_tensor(decode_lens), logits_index=as_tensor(logits_index),
            expert_counts=expert_counts)

    @torch.inference_mode()
    def run(self, items: list[FeedItem], expert_counts: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Logits [item.logits, V] for each item, in order."""
        if not items:
            return []
        logits = self.model(self.build_batch(items, expert_counts), self.k_caches, self.v_caches)
        return list(logits.split([item.logits for item in items]))
