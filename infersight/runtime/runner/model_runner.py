"""Turns "feed these tokens of these requests" into a ForwardBatch and runs one model on it.

Pure decode steps replay a CUDA graph when use_cuda_graphs() found that they can (cuda_graphs);
everything else, and every step on the CPU, runs the model eagerly.
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import torch

from infersight.runtime.runner.cuda_graphs import DecodeGraphs, bucket_for, compile_layers, graph_blocker, width_buckets
from infersight.runtime.model.forward_batch import ForwardBatch, Segment
from infersight.runtime.model.packed_segments import SegmentSpan, pack_segments, packed_kernel
from infersight.runtime.model.forward_fused import FusedForward, fused_forward_problem
from infersight.runtime.model.transformer import Transformer
from infersight.runtime.engine.request import Request

if TYPE_CHECKING:
    from infersight.runtime.config import EngineConfig

log = logging.getLogger("infersight.runtime")


@dataclass(slots=True)
class FeedItem:
    """Tokens to feed for one request, starting at absolute position start_pos.

    logits: how many trailing positions need logits (0 for a prefill chunk that is not the last)."""

    req: Request
    start_pos: int
    tokens: list[int]
    logits: int


class LogitsRows(Sequence[torch.Tensor]):
    """Each item's logits, rows [item.logits, V] of one [N, V] tensor, as views made when read.

    Equal, row for row, to logits.split(counts); but a greedy graph step never reads its rows (the
    tokens came back from the graph), and 32 split views cost ~20 us of host time per step."""

    __slots__ = ("full", "starts")

    def __init__(self, full: torch.Tensor, counts: list[int]) -> None:
        self.full = full
        self.starts = [0, *itertools.accumulate(counts)]

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, i: int) -> torch.Tensor:  # type: ignore[override]
        n = len(self.starts) - 1
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"logits row {i} of {n}")
        return self.full[self.starts[i]:self.starts[i + 1]]

    def __iter__(self) -> Iterator[torch.Tensor]:
        full, starts = self.full, self.starts
        return (full[starts[i]:starts[i + 1]] for i in range(len(starts) - 1))


#: The block table of a segment the batch carries packed: never read (ForwardBatch.packed has the slots).
_NO_TABLE = torch.empty(0, dtype=torch.long)


class ModelRunner:
    def __init__(self, model: Transformer, k_caches: torch.Tensor, v_caches: torch.Tensor,
                 block_size: int, device: str, packed_prefill: bool = False) -> None:
        self.model = model
        self.k_caches, self.v_caches = k_caches, v_caches
        self.block_size = block_size
        self.device = device
        self.packed_prefill = packed_prefill  # EngineConfig.packed_prefill: steps of 2+ segments packed
        # flash's variable-length kernel where it runs (CUDA, 16-bit), else SDPA under a mask
        self.packed_kernel = packed_kernel(device, next(model.parameters()).dtype, model.cfg.head_dim)
        self.graphs: DecodeGraphs | None = None
        self.graph_blocker: str | None = "not set up"
        # Decode block tables are padded to these widths (the Triton kernel's splits follow the
        # width), so eager and graph steps of one batch run the same kernels on the same shapes.
        self.decode_widths: list[int] | None = None
        self.last_logits: torch.Tensor | None = None  # the last run's logits, all items' rows
        # On CUDA, every forward runs these kernels when set (pure decode batches through decode()).
        self.fused: FusedForward | None = None
        self.device_tokens: torch.Tensor | None = None  # the last run's greedy tokens, when a graph left them

    @property
    def num_captures(self) -> int:
        """CUDA graphs captured (or tried) so far: the engine marks the steps that paid for one."""
        return self.graphs.num_captures if self.graphs is not None else 0

    def capture_decode_graphs(self, expert_counts: torch.Tensor | None) -> int:
        """Capture every decode graph now (DecodeGraphs.capture_all); 0 without graphs."""
        return self.graphs.capture_all(expert_counts) if self.graphs is not None else 0

    def use_cuda_graphs(self, config: "EngineConfig", decode_attention: str) -> str | None:
        """Run pure decode steps as CUDA graphs where they can be; returns why not (None: they are)."""
        assert config.max_model_len is not None
        max_blocks = -(-config.max_model_len // self.block_size)
        if decode_attention == "triton" and self.device.startswith("cuda"):
            self.decode_widths = width_buckets(max_blocks)
        if config.compile_layers and self.device.startswith("cuda"):
            compile_layers(self.model)
        if config.fused_forward and fused_forward_problem(self.model, self.device, decode_attention) is None:
            self.fused = FusedForward(self.model, gemv=config.decode_gemv)
        reason = graph_blocker(self.model, self.device, decode_attention, config.enforce_eager)
        if reason is None and self.k_caches.shape[1] <= (config.num_kv_blocks or 0):
            reason = "no spare KV block for padding rows"
        self.graph_blocker = reason
        if reason is None:
            self.graphs = DecodeGraphs(self.model, self.k_caches, self.v_caches, self.block_size,
                                       config.max_num_seqs, config.max_model_len,
                                       pad_block=self.k_caches.shape[1] - 1, device=self.device,
                                       forward=self.fused.decode if self.fused is not None else None,
                                       async_steps=config.async_scheduling)
        else:
            log.info("decode steps run eagerly: %s", reason)
        return reason

    def build_batch(self, items: list[FeedItem], expert_counts: torch.Tensor | None) -> ForwardBatch:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_index: list[int] = []
        segments: list[Segment] = []
        spans: list[SegmentSpan] = []
        # Packed, no segment reads its own block table: skip the per-segment host-to-device copy.
        packed = self.packed_prefill and sum(len(item.tokens) > 1 for item in items) >= 2
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
                if packed:
                    segments.append(Segment(start, n, context, _NO_TABLE))
                    spans.append(SegmentSpan(start, n, context, table))
                else:
                    segments.append(Segment(start, n, context, torch.tensor(table, device=self.device)))
        width = max((len(t) for t in decode_tables), default=0)
        if self.decode_widths and width:
            width = bucket_for(width, self.decode_widths) or width
        padded = [t + [0] * (width - len(t)) for t in decode_tables]

        def as_tensor(values: list[int] | list[list[int]]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=self.device)

        return ForwardBatch(
            input_ids=as_tensor(input_ids), positions=as_tensor(positions), slot_mapping=as_tensor(slots),
            segments=segments, decode_index=as_tensor(decode_index),
            decode_block_tables=as_tensor(padded).view(len(padded), width),
            decode_context_lens=as_tensor(decode_lens), logits_index=as_tensor(logits_index),
            expert_counts=expert_counts,
            packed=pack_segments(spans, bs, self.device, self.packed_kernel) if packed else None)

    def greedy_tokens(self, rows: int) -> list[int] | None:
        """The argmax of each of the last run's `rows` logits rows, when a decode graph already
        copied them to the host (runtime.runner.graph_tokens); None: take them from the logits."""
        return self.graphs.tokens.take(rows) if self.graphs is not None else None

    @torch.inference_mode()
    def run(self, items: list[FeedItem], expert_counts: torch.Tensor | None = None,
            graphs_while_profiling: bool = False, src: list[int] | None = None,
            prev: torch.Tensor | None = None) -> "LogitsRows | list[torch.Tensor]":
        """Logits [item.logits, V] for each item, in order. graphs_while_profiling: a pure decode
        step may replay its CUDA graph while torch.profiler records (cuda_graphs.graph_step_allowed).

        src, prev: a pure decode step of async scheduling (runtime.engine.async_steps), whose item i feeds
        prev[src[i]] (the token the step before left on the device) where src[i] >= 0, in place of
        its placeholder token. After such a graph step, device_tokens holds the greedy tokens."""
        self.device_tokens = None
        if not items:
            return []
        logits = (self.graphs.run(items, expert_counts, graphs_while_profiling, src, prev)
                  if self.graphs is not None else None)
        if logits is not None and self.graphs is not None:
            self.device_tokens = self.graphs.last_tokens
        if logits is None:
            forward = self.model
            if self.fused is not None:
                pure_decode = all(len(it.tokens) == 1 and it.logits == 1 for it in items)
                forward = self.fused.decode if pure_decode else self.fused.forward
            batch = self.build_batch(items, expert_counts)
            if src is not None and prev is not None:  # one token per item: input row i is item i
                index = torch.tensor(src, dtype=torch.long, device=self.device)
                batch.input_ids = torch.where(index >= 0, prev[index.clamp(min=0)], batch.input_ids)
            logits = forward(batch, self.k_caches, self.v_caches)
        self.last_logits = logits
        return LogitsRows(logits, [item.logits for item in items])
