"""What one model forward computes: a flat list of tokens from many sequences, and where their KV lives.

Tokens of all scheduled sequences are concatenated (no padding). Sequences that feed exactly one
token attend through the paged decode kernel; sequences that feed several (prefill chunks, the
speculative verify window) attend through the tiled prefill kernel over their gathered context.

    input_ids   [ s0 s0 s0 s0 | s1 | s2 s2 | s3 ]     s1, s3: single-token decodes
    slot_mapping  where each token's K/V is written: block_id * block_size + offset
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from infersight.runtime.model.packed_segments import PackedSegments


@dataclass
class Segment:
    """A multi-token run of one sequence: tokens [start, start+length) of the flat batch sit at
    positions [context_len-length, context_len) of the sequence, whose KV spans block_table (empty
    when the batch carries its segments packed: nothing reads it then)."""

    start: int
    length: int
    context_len: int
    block_table: torch.Tensor


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor          # [T] int64
    positions: torch.Tensor          # [T] int64
    slot_mapping: torch.Tensor       # [T] int64
    segments: list[Segment]
    decode_index: torch.Tensor       # [Bd] token indices of single-token sequences
    decode_block_tables: torch.Tensor  # [Bd, max_blocks] int64
    decode_context_lens: torch.Tensor  # [Bd] int64
    logits_index: torch.Tensor       # [N] token indices whose logits are returned
    expert_counts: torch.Tensor | None = None  # [n_layers, n_experts] step buffer, on device
    packed: PackedSegments | None = None  # the segments as one attention problem (EngineConfig.packed_prefill)
