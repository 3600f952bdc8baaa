"""CUDA graphs for pure decode steps, captured per (batch-size bucket, block-table-width bucket).

A decode step of a small model is hundreds of short kernels; launched one by one from Python the
GPU idles between them. Replaying a captured graph launches them all at once. A graph fixes its
shapes and addresses, so (as in vLLM's model runner) the inputs live in static buffers that each
step overwrites, and a batch of n sequences runs the graph of the smallest bucket >= n:

    batch buckets  1 2 4 8 16 24 32 ... (multiples of 8, up to max_num_seqs)
    width buckets  4 8 16 32 ... blocks (powers of two, up to max_model_len's blocks)

Padding rows (bucket - n of them) feed token 0 at position 0 with a context of one token, and
write their K/V to a spare block that no request owns (pad_block), so they touch no real KV.
Their logits are computed and dropped. The block-table width is bucketed too, because the decode
kernel splits the context by the table's width: a table as wide as max_model_len would leave most
splits empty. Eager CUDA steps use the same width buckets (ModelRunner), so a batch that fills its
bucket gets bit-identical logits in graph and eager mode.

Host side, one pinned int64 buffer holds every input (runtime.runner.graph_inputs). Where the driver
lets it, the graph itself copies that buffer to the device at replay time and copies the argmax of
its logits into a pinned host buffer (runtime.runner.graph_tokens), so a greedy step costs the host one
launch and one wait; elsewhere the input copy is launched before each replay.

What stays eager: prefill and mixed steps, speculative verify, steps while torch.profiler records
unless the capture asked for graph replays (graph_step_allowed: a full capture keeps its per-layer
ranges; a kernel-activity window, the flight recorder's, replays the graphs the engine really runs,
and never captures a new one under the profiler), MoE layers still on the "loop"
expert path (it reads the per-expert counts on the host), and the torch decode reference (it reads
the longest context on the host). MoE models get a graph per exact batch size instead of per
bucket: padding rows would be routed, and counted in the step's expert counts, which the graph
accumulates on the device like the eager step does. Graphs share one memory pool; each graph's
logits stay valid until the next replay of any graph, and the engine reads them before that.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from infersight.runtime.model.forward_batch import ForwardBatch
from infersight.runtime.runner.graph_inputs import DecodeFeed, DecodeInputs, decode_rows
from infersight.runtime.runner.graph_tokens import GraphTokens

if TYPE_CHECKING:
    from infersight.runtime.model.transformer import Transformer

log = logging.getLogger("infersight.runtime")

MIN_WIDTH_BLOCKS = 4


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, then multiples of 8, ending at max_batch (vLLM's capture sizes, capped)."""
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8))
    return sizes + [max_batch]


def width_buckets(max_blocks: int) -> list[int]:
    """Powers of two from MIN_WIDTH_BLOCKS, ending at max_blocks."""
    sizes = []
    w = MIN_WIDTH_BLOCKS
    while w < max_blocks:
        sizes.append(w)
        w *= 2
    return sizes + [max_blocks]


def bucket_for(n: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket >= n, None when n is past the last."""
    for b in buckets:
        if b >= n:
            return b
    return None


def graph_blocker(model: "Transformer", device: str, decode_attention: str, enforce_eager: bool) -> str | None:
    """Why decode steps of this model cannot run as CUDA graphs here, or None when they can."""
    if enforce_eager:
        return "enforce_eager"
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return "not a CUDA device"
    if decode_attention != "triton":
        return "the torch decode attention reads the longest context on the host"
    return None


def graph_step_allowed(profiling: bool, graphs_while_profiling: bool, captured: bool) -> bool:
    """Whether a pure decode step may run as a graph (replayed, or captured first when not `captured`).

    Outside torch.profiler always. While it records, only when the capture request chose graph
    replays (probes.control.CaptureDecode.GRAPHS, carried to here through the engine's observer),
    and only a graph captured before: a capture under the profiler would record the warm-up's
    kernels into the trace and run under CUPTI's callbacks. Otherwise eager, so the profiler sees
    each layer's ranges and kernels (CaptureDecode.EAGER, the full capture's default)."""
    if not profiling:
        return True
    return graphs_while_profiling and captured


def moe_syncs_host(model: "Transformer", tokens: int) -> bool:
    """True when some MoE layer would run the host-syncing "loop" expert path on `tokens` tokens
    (its path is fixed by expert_path, else chosen per call by runtime.model.moe.choose_path), or has
    not run yet (so it does not know whether the grouped GEMM works here)."""
    from infersight.runtime.model.moe import choose_path

    for layer in model.layers:
        ffn = layer.ffn
        if not hasattr(ffn, "router"):
            continue
        path = getattr(ffn, "expert_path", "loop")
        if path is None:
            grouped_ok = getattr(ffn, "_grouped_ok", None)
            if grouped_ok is None:
                return True
            path = choose_path(tokens * ffn.top_k, ffn.n_experts, grouped_ok)
        if path == "loop":
            return True
    return False


def compile_layers(model: "Transformer") -> None:
    """torch.compile (inductor, dynamic shapes) each layer's RMSNorms, the RoPE and the SwiGLU:
    their dozens of small elementwise kernels become a few fused ones, which is most of a
    decode graph's device time on a small model. Captures then hold the compiled kernels.
    CUDA only; the CPU path never compiles."""
    from infersight.runtime.model.layers import RMSNorm, RotaryEmbedding, SwiGLU

    for module in model.modules():
        if isinstance(module, (RMSNorm, RotaryEmbedding, SwiGLU)):
            module.forward = torch.compile(module.forward, dynamic=True)  # type: ignore[method-assign]


class DecodeGraphs:
    """Captures lazily, on the first step of each (batch bucket, width bucket), and replays."""

    def __init__(self, model: "Transformer", k_caches: torch.Tensor, v_caches: torch.Tensor, block_size: int,
                 max_batch: int, max_model_len: int, pad_block: int, device: str,
                 forward: Callable[[ForwardBatch, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 async_steps: bool = False) -> None:
        self.model, self.k_caches, self.v_caches = model, k_caches, v_caches
        self.forward = forward if forward is not None else model  # what a capture records
        self.block_size = block_size
        max_blocks = -(-max_model_len // block_size)
        self.is_moe = model.cfg.is_moe
        self.batch_sizes = list(range(1, max_batch + 1)) if self.is_moe else batch_buckets(max_batch)
        self.widths = width_buckets(max_blocks)
        # Async scheduling (runtime.engine.async_steps): two staging buffers; each graph takes its input
        # tokens from the step before it on the device and leaves its greedy tokens in next_tokens.
        self.async_steps = async_steps
        self.inputs = DecodeInputs(max_batch, max_blocks, block_size, pad_block, device, staging=2 if async_steps else 1)
        self.next_tokens = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.last_tokens: torch.Tensor | None = None  # the last async replay's greedy tokens, on the device
        self.pool = torch.cuda.graph_pool_handle()
        # (bucket, width) -> (graph, its logits, the expert-count buffer it accumulates into, whether
        # it copies its inputs in and its greedy tokens out itself: GraphTokens)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None, bool]] = {}
        self.tokens = GraphTokens(max_batch)
        # Off after a capture with in-graph copies failed here; never with async steps, whose
        # host-side copies alternate between buffers (runtime.engine.async_steps)
        self.in_graph_io = not async_steps
        self.disabled: str | None = None
        self.num_replays = 0
        # Captures tried (each one a one-time cost of seconds' order in all: the step that pays it is
        # no sample of the steady step time, StepStats.graph_captures).
        self.num_captures = 0

    def width_for(self, n_blocks: int) -> int:
        return bucket_for(n_blocks, self.widths) or n_blocks

    def run(self, items: Sequence[DecodeFeed], expert_counts: torch.Tensor | None = None,
            graphs_while_profiling: bool = False, src: list[int] | None = None,
            prev: torch.Tensor | None = None) -> torch.Tensor | None:
        """Logits [len(items), V] of a pure decode step by graph replay; None: run it eagerly.
        graphs_while_profiling: see graph_step_allowed. src, prev (async steps only): row i's input
        token is prev[src[i]] where src[i] >= 0 (prev: the tokens of the step before, on the device)."""
        self.tokens.forget()
        self.last_tokens = None
        if src is not None and not self.async_steps:
            raise ValueError("device-fed input tokens need graphs captured for async steps")
        profiling = torch.autograd.profiler._is_profiler_enabled
        if self.disabled or (profiling and not graphs_while_profiling):
            return None
        rows = decode_rows(items, self.block_size)
        if rows is None:
            return None
        bucket = bucket_for(len(rows), self.batch_sizes)
        if bucket is not None and self.is_moe and moe_syncs_host(self.model, bucket):
            return None
        width = bucket_for(rows.max_blocks, self.widths)
        if bucket is None or width is None:
            return None
        entry = self.graphs.get((bucket, width))
        if not graph_step_allowed(profiling, graphs_while_profiling, entry is not None):
            return None
        if entry is None:
            entry = self._capture(bucket, width, expert_counts)
            if entry is None:
                return None
        if entry[2] is not expert_counts:  # captured with another counter (or none): eager this step
            return None
        self.tokens.wait()
        rows.src = src
        self.inputs.fill(rows, bucket, width, copy=not entry[3])
        if prev is not None and src is not None and prev.data_ptr() != self.next_tokens.data_ptr():
            self.next_tokens[:len(prev)].copy_(prev)  # an eager step's tokens: where the graph reads them
        entry[0].replay()
        if entry[3]:
            self.tokens.replayed(len(rows))
        if self.async_steps:
            self.last_tokens = self.next_tokens[:len(rows)]
        self.num_replays += 1
        return entry[1][:len(rows)]

    def capture_all(self, expert_counts: torch.Tensor | None) -> int:
        """Capture every (batch size, width) graph not captured yet, as vLLM does at start-up: a
        server that captures lazily pays each capture on some request's step (and, for a MoE
        model's graph per exact batch size, that is most of the first minutes' decode steps).
        Returns how many were captured; stops at the first capture that fails (graphs are then off).
        MoE layers decide their expert path first: before any forward they do not know it, and every
        MoE step would be skipped here and captured on a request's step instead (the demo on the
        H200 captured 15 of its plain probe steps lazily, 12-25 ms each)."""
        param = next(self.model.parameters())
        for layer in self.model.layers:
            if hasattr(layer.ffn, "learn_grouped"):
                layer.ffn.learn_grouped(param.device, param.dtype)
        done = 0
        for bucket in self.batch_sizes:
            if self.is_moe and moe_syncs_host(self.model, bucket):
                continue  # these steps run eagerly anyway
            for width in self.widths:
                if (bucket, width) in self.graphs:
                    continue
                if self.disabled or self._capture(bucket, width, expert_counts) is None:
                    return done
                done += 1
        return done

    def _capture(self, bucket: int, width: int, expert_counts: torch.Tensor | None
                 ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None, bool] | None:
        self.num_captures += 1
        batch = self.inputs.batch(bucket, width, expert_counts)
        self.tokens.wait()
        self.inputs.fill([], bucket, width)  # every row padding: the warm-up and capture touch no real KV
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # compiles Triton kernels and sets cuBLAS up outside the capture
                self.forward(batch, self.k_caches, self.v_caches)
            torch.cuda.current_stream().wait_stream(side)
            graph, logits, io = self._record(batch, bucket, width)
        except Exception as exc:  # noqa: BLE001 -- a model that cannot be captured still runs eagerly
            self.disabled = f"capture failed: {type(exc).__name__}: {exc}"
            log.warning("CUDA graphs off for this engine (%s); decode runs eagerly", self.disabled)
            return None
        finally:
            if expert_counts is not None:
                expert_counts.zero_()  # the warm-up routed padding rows into it; the step's own forward follows
        self.graphs[(bucket, width)] = entry = (graph, logits, expert_counts, io)
        return entry

    def _record(self, batch: ForwardBatch, bucket: int, width: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, bool]:
        """Capture the forward, with the input copy and the greedy tokens' copy inside when that
        works here (else, once for all, without: the copies are then launched around each replay)."""
        if self.in_graph_io:
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                    self.inputs.copy_in(bucket, width)
                    logits = self.forward(batch, self.k_caches, self.v_caches)
                    self.tokens.capture(logits)
                return graph, logits, True
            except Exception as exc:  # noqa: BLE001 -- the plain capture below is the fallback
                self.in_graph_io = False
                log.info("decode graphs copy their inputs and tokens outside the graph (%s: %s)",
                         type(exc).__name__, exc)
                torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            if self.async_steps:
                src = self.inputs.token_src(bucket)
                batch.input_ids.copy_(torch.where(src >= 0, self.next_tokens[src.clamp(min=0)], batch.input_ids))
            logits = self.forward(batch, self.k_caches, self.v_caches)
            if self.async_steps:
                self.next_tokens[:bucket].copy_(logits.argmax(-1))
        return graph, logits, False
