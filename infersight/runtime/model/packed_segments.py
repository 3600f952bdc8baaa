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

Two kernels take the packed form (PackedKernel):
- "masked": torch SDPA under the block-diagonal mask. It computes the whole [queries, keys] product,
  masked, where the loop computed only each segment's own block; with k segments of like size that is
  about k times the attention arithmetic, bounded here by the step's token budget. Any device.
- "varlen": flash attention's variable-length kernel (torch.nn.attention.varlen), which takes the
  segments' boundaries (cumulative query and key counts) instead of a mask and computes only each
  segment's own causal block, queries aligned to the end of their keys (a chunk after a prefix).
  CUDA only, 16-bit floats, compute capability 8.0 or above (packed_kernel).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch


PackedKernel = Literal["masked", "varlen"]


@dataclass
class PackedSegments:
    q_index: torch.Tensor   # [Tq] int64: the segments' rows of the flat batch, segment by segment
    kv_slots: torch.Tensor  # [Tk] int64: the cache slots of every segment's context, segment by segment
    mask: torch.Tensor | None  # [Tq, Tk] bool, query i may attend key j ("masked"); None for "varlen"
    # "varlen": segment i's queries are rows cu_q[i]:cu_q[i+1] of q_index, its keys cu_k[i]:cu_k[i+1] of kv_slots
    cu_q: torch.Tensor | None = None  # [segments + 1] int32
    cu_k: torch.Tensor | None = None  # [segments + 1] int32
    max_q: int = 0  # the longest segment's queries
    max_k: int = 0  # the longest segment's context


def packed_kernel(device: str, dtype: torch.dtype, head_dim: int) -> PackedKernel:
    """The kernel packed segments run on here: "varlen" where torch's flash variable-length kernel runs
    (CUDA at compute capability 8.0+, float16 or bfloat16, head_dim a multiple of 8 up to 256), else
    "masked"."""
    if not device.startswith("cuda") or dtype not in (torch.float16, torch.bfloat16):
        return "masked"
    if head_dim % 8 or head_dim > 256 or torch.cuda.get_device_capability(torch.device(device)) < (8, 0):
        return "masked"
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401  (torch >= 2.10)
    except ImportError:
        return "masked"
    return "varlen"


@dataclass(frozen=True)
class SegmentSpan:
    """What packing needs of one segment: its rows [start, start + length) of the flat batch sit at
    positions [context_len - length, context_len) of a sequence whose blocks are `blocks`."""

    start: int
    length: int
    context_len: int
    blocks: Sequence[int]


def pack_segments(spans: Sequence[SegmentSpan], block_size: int, device: torch.device | str,
                  kernel: PackedKernel = "masked") -> PackedSegments:
    """The packed form of `spans` (at least one) for `kernel`. Index arithmetic on the host; the mask
    ("masked") or the segment boundaries ("varlen") on `device`."""
    if not spans:
        raise ValueError("pack_segments needs at least one segment")
    lengths = [s.length for s in spans]
    contexts = [s.context_len for s in spans]
    q_index = np.concatenate([np.arange(s.start, s.start + s.length) for s in spans])
    k_pos = np.concatenate([np.arange(c) for c in contexts])
    owner = np.arange(len(spans))
    k_seg = np.repeat(owner, contexts)
    n_blocks = [-(-c // block_size) for c in contexts]
    blocks = np.concatenate([np.asarray(s.blocks[:n], dtype=np.int64) for s, n in zip(spans, n_blocks)])
    first_block = np.concatenate([[0], np.cumsum(n_blocks)[:-1]])
    kv_slots = blocks[first_block[k_seg] + k_pos // block_size] * block_size + k_pos % block_size

    def on_device(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)

    if kernel == "varlen":
        def bounds(counts: list[int]) -> torch.Tensor:
            return torch.tensor([0, *np.cumsum(counts).tolist()], dtype=torch.int32).to(device)
        return PackedSegments(q_index=on_device(q_index), kv_slots=on_device(kv_slots), mask=None,
                              cu_q=bounds(lengths), cu_k=bounds(contexts), max_q=max(lengths), max_k=max(contexts))
    q_pos = np.concatenate([np.arange(s.context_len - s.length, s.context_len) for s in spans])
    q_seg = np.repeat(owner, lengths)
    qs, ks, qp, kp = on_device(q_seg), on_device(k_seg), on_device(q_pos), on_device(k_pos)
    mask = (qs[:, None] == ks[None, :]) & (kp[None, :] <= qp[:, None])
    return PackedSegments(q_index=on_device(q_index), kv_slots=on_device(kv_slots), mask=mask)
