"""A step's multi-token segments as one attention problem (EngineConfig.packed_prefill).

Per segment, prefill attention gathers the segment's context out of the paged cache, builds its
causal mask and calls the kernel, in every layer: on CUDA each of those is a host-side launch, and
the serving profile on the H100 (12-05) put 31% of `serve`'s engine thread in that loop. Packed,
the step's segments become one query set and one key set with a block-diagonal causal mask, built
once per step and shared by every layer, so a layer makes one gather per cache and one kernel call
however many segments the step holds.

    queries  [ a0 a1 a2 | b0 b1 ]          keys  [ A0 A1 A2 A3 A4 | B0 B1 B2 ]
    a query sees the keys of its own sequence at positions <= its own:
             a0 (pos 2): A0 A1 A2          b0 (pos 1): B0 B1

The price: the kernel computes the whole [queries, keys] product, masked, where the loop computed
only each segment's own block; with k segments of like size that is about k times the attention
arithmetic, bounded here by the step's token budget.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass
class PackedSegments:
    q_index: torch.Tensor   # [Tq] int64: the segments' rows of the flat batch, segment by segment
    kv_slots: torch.Tensor  # [Tk] int64: the cache slots of every segment's context, segment by segment
    mask: torch.Tensor      # [Tq, Tk] bool: query i may attend key j


@dataclass(frozen=True)
class SegmentSpan:
    """What packing needs of one segment: its rows [start, start + length) of the flat batch sit at
    positions [context_len - length, context_len) of a sequence whose blocks are `blocks`."""

    start: int
    length: int
    context_len: int
    blocks: Sequence[int]


def pack_segments(spans: Sequence[SegmentSpan], block_size: int, device: torch.device | str) -> PackedSegments:
    """The packed form of `spans` (at least one). Index arithmetic on the host, the mask on `device`."""
    if not spans:
        raise ValueError("pack_segments needs at least one segment")
    q_index = np.concatenate([np.arange(s.start, s.start + s.length) for s in spans])
    q_pos = np.concatenate([np.arange(s.context_len - s.length, s.context_len) for s in spans])
    k_pos = np.concatenate([np.arange(s.context_len) for s in spans])
    owner = np.arange(len(spans))
    q_seg = np.repeat(owner, [s.length for s in spans])
    k_seg = np.repeat(owner, [s.context_len for s in spans])
    n_blocks = [-(-s.context_len // block_size) for s in spans]
    blocks = np.concatenate([np.asarray(s.blocks[:n], dtype=np.int64) for s, n in zip(spans, n_blocks)])
    first_block = np.concatenate([[0], np.cumsum(n_blocks)[:-1]])
    kv_slots = blocks[first_block[k_seg] + k_pos // block_size] * block_size + k_pos % block_size

    def on_device(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)

    qs, ks, qp, kp = on_device(q_seg), on_device(k_seg), on_device(q_pos), on_device(k_pos)
    mask = (qs[:, None] == ks[None, :]) & (kp[None, :] <= qp[:, None])
    return PackedSegments(q_index=on_device(q_index), kv_slots=on_device(kv_slots), mask=mask)
