"""Routed expert ids counted on the device, and published as MOE probe records from a side thread.

Engine-agnostic and vLLM-free (torch and numpy only), so it is tested on hand-built routers; the vLLM
plugin (``infersight.vllm.experts``) binds it to vLLM's MoE layers::

    model thread (in the forward, no host sync):
        router of layer r --topk_ids [tokens, top_k]--> counts[r] += one per (token, chosen expert)
    publisher thread (every interval, never in a step):
        snapshot <- counts   (CPU: the tensor's memory; CUDA: a side-stream copy to pinned memory)
        MOE records <- snapshot - previous snapshot  ->  ring

The counts are cumulative and only ever grow, so a snapshot taken while a layer is being counted is
merely early: the next delta carries the rest, and the deltas sum exactly to the counts. ``count``
is pure tensor work with static shapes, so torch.compile (vLLM's CPU path traces the MoE layer with
Dynamo, ``fullgraph=True``) folds it into the model's graph, and CUDA graphs record it.

Why a thread rather than the step boundary: on the CPU path the forward streams the weights through
the caches, and any Python run right after it starts cold. Measured on the tiny Mixtral, a per-step
publish (snapshot, records, ring write: ~6 us with warm caches) cost 60-70 us of CPU per 2.7 ms step,
over twice the 1% budget; the thread pays that once per interval instead.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np
import torch

from infersight.probes.records import MOE_EXPERTS_PER_RECORD, RecordKind, record_dtype
from infersight.probes.ring import RingProducer

#: Up to this many experts a layer is counted by comparing each routed id with every expert id and
#: summing (inductor fuses it into kernels the graph runs anyway); above it by index_add_, whose scatter inductor
#: leaves to an ATen call on CPU. Measured on the CPU path (4 layers, decode batches of 4 tokens,
#: thread CPU time): compare-and-sum added ~5 us a step at 4 experts where index_add_ added ~60 us.
COMPARE_MAX_EXPERTS = 32


class ExpertCounter:
    """Tokens routed to each (layer row, expert), cumulative, on ``device``.

    ``rows`` are the counter's own dense layer indices; ``layer_ids`` maps them to the model's layer
    numbers (what the MOE records carry). Each token counts once per expert it is routed to, so a
    layer's row grows by top_k x tokens forwarded."""

    def __init__(self, layer_ids: list[int], n_experts: int, device: torch.device | str = "cpu") -> None:
        if not layer_ids or n_experts < 1:
            raise ValueError(f"need at least one layer and one expert, got {len(layer_ids)} layers, {n_experts} experts")
        self.layer_ids = list(layer_ids)
        self.n_experts = n_experts
        self.counts = torch.zeros((len(layer_ids), n_experts), dtype=torch.int64, device=device)
        self._expert_ids = torch.arange(n_experts, device=device)
        self._compare = n_experts <= COMPARE_MAX_EXPERTS

    def count(self, row: int, topk_ids: torch.Tensor) -> None:
        """Add one layer's routing decision: ``topk_ids`` [tokens, top_k], the experts each token goes
        to. Static shapes only (no bincount, whose length depends on the data), so Dynamo can put it
        in a full graph; ``_compare`` is fixed at construction, so tracing bakes one branch.

        An id of -1 is not counted: vLLM's routers give padding rows (CUDA-graph or data-parallel
        padding, VLLM_MOE_SKIP_PADDING, on by default; fused and grouped top-k in 0.32-0.34) expert -1.
        The comparison matches no expert for it; index_add_ would raise (a device assert on CUDA), so
        there it is added as 0 at index 0."""
        if self._compare:
            self.counts[row] += (topk_ids.reshape(-1, 1) == self._expert_ids).sum(0)
        else:
            flat = topk_ids.reshape(-1)
            self.counts[row].index_add_(0, flat.clamp(min=0), (flat >= 0).to(torch.int64))


class CountsReader:
    """Snapshots of a counter's cumulative counts taken from another thread, without stopping the
    model. CPU: a copy of the tensor's memory. CUDA: a copy on a side stream into pinned memory,
    waited for on that stream only; the model's stream never waits."""

    def __init__(self, counter: ExpertCounter) -> None:
        self.counter = counter
        self._last = np.zeros(tuple(counter.counts.shape), dtype=np.int64)
        if counter.counts.is_cuda:
            self._view = None
            self._pinned = torch.zeros(counter.counts.shape, dtype=torch.int64, pin_memory=True)
            self._stream = torch.cuda.Stream(counter.counts.device)
        else:
            self._view = counter.counts.numpy()  # shares the tensor's memory

    def delta(self) -> np.ndarray:
        """What was counted since the previous call (the first call: since the counter was made)."""
        if self._view is not None:
            now = self._view.copy()
        else:
            # vLLM made these tensors under inference mode; this thread is not in it unless asked.
            with torch.inference_mode(), torch.cuda.stream(self._stream):
                self._pinned.copy_(self.counter.counts, non_blocking=True)
            self._stream.synchronize()
            now = self._pinned.numpy().copy()
        out, self._last = now - self._last, now
        return out


class MoeRecords:
    """Counts [layers, experts] as MOE probe records: one per (layer, block of MOE_EXPERTS_PER_RECORD
    experts). Allocated once; ``fill`` writes only the step id and the counts."""

    def __init__(self, layer_ids: list[int], n_experts: int) -> None:
        per = MOE_EXPERTS_PER_RECORD
        self.blocks = blocks = -(-n_experts // per)
        self.n_experts = n_experts
        self.records = np.zeros(len(layer_ids) * blocks, dtype=record_dtype(RecordKind.MOE))
        self.records["layer"] = np.repeat(np.asarray(layer_ids, dtype=np.uint16), blocks)
        self.records["expert_offset"] = np.tile(np.arange(blocks, dtype=np.uint16) * per, len(layer_ids))
        self.records["n_experts"] = n_experts
        self._counts = self.records["counts"]  # a view into the records: filling it fills them

    def fill(self, step_id: int, counts: np.ndarray) -> np.ndarray:
        """The records of ``counts`` for ``step_id`` (a view, valid until the next fill)."""
        per = MOE_EXPERTS_PER_RECORD
        self.records["step_id"] = step_id
        for b in range(self.blocks):
            width = min(per, self.n_experts - b * per)
            np.copyto(self._counts[b::self.blocks, :width], counts[:, b * per:b * per + width], casting="unsafe")
        return self.records


class ExpertPublisher:
    """A daemon thread that writes what the counter counted, every ``interval_s``, to ``ring``: one
    batch of MOE records per interval with new counts, numbered 1, 2, ... in ``step_id`` (the
    publish window, not an engine step). It is the ring's only producer until ``stop``."""

    def __init__(self, counter: ExpertCounter, ring: RingProducer, interval_s: float,
                 after_publish: Callable[[], None] | None = None,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.reader = CountsReader(counter)
        self.records = MoeRecords(counter.layer_ids, counter.n_experts)
        self.ring = ring
        self.interval_s = interval_s
        self.window = 0
        self.times = CostTimes()
        self.after_publish = after_publish  # called in the thread after each publish (timing files)
        self.on_error = on_error  # the thread stops at its first error and reports it here
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infersight-expert-counts", daemon=True)

    def start(self) -> "ExpertPublisher":
        self._thread.start()
        return self

    def publish(self) -> int:
        """Write what was counted since the last call; returns how many records were written."""
        t0 = CostTimes.now()
        delta = self.reader.delta()
        written = 0
        if delta.any():
            self.window += 1
            written = self.ring.write_many(RecordKind.MOE, self.records.fill(self.window, delta))
        self.times.add("publish", t0, CostTimes.now())
        return written

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self.publish()
                if self.after_publish is not None:
                    self.after_publish()
        except Exception as exc:
            if self.on_error is not None:
                self.on_error(exc)

    def stop(self) -> None:
        """Stop the thread and publish what is left (from the caller's thread, then the only producer)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.publish()


class CostTimes:
    """Where the plugin's own time goes, by name: calls, wall time (perf_counter_ns) and the calling
    thread's CPU time (thread_time_ns: time the thread was preempted by other work sharing the
    cores does not count). Single writer per name; read by the plugin's timing file."""

    def __init__(self) -> None:
        self.totals: dict[str, list[int]] = {}

    @staticmethod
    def now() -> tuple[int, int]:
        return time.perf_counter_ns(), time.thread_time_ns()

    def add(self, name: str, start: tuple[int, int], end: tuple[int, int]) -> None:
        total = self.totals.setdefault(name, [0, 0, 0])
        total[0] += 1
        total[1] += end[0] - start[0]
        total[2] += end[1] - start[1]

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {name: {"calls": c, "wall_ns": w, "cpu_ns": u} for name, (c, w, u) in list(self.totals.items())}
