"""Counting routed expert ids on the device, and handing one step's counts to the host without a sync.

Engine-agnostic and vLLM-free (torch and numpy only), so it is tested on hand-built routers; the vLLM
plugin (``infersight.vllm.experts``) binds it to vLLM's MoE layers.

Per step, on the device::

    router of layer r --topk_ids [tokens, top_k]--> counts[r].index_add_(ids, 1)   (no host sync)
    step boundary:  pinned[flip] <- counts (non-blocking);  counts <- 0;  event.record()
    next boundary:  event of the previous step has long completed -> read pinned[previous] on the host

``count`` is pure tensor work with static shapes, so torch.compile (vLLM's CPU path traces the MoE
layer with Dynamo, ``fullgraph=True``) folds it into the model's graph; under CUDA graphs it is
recorded and replayed like the layer itself.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from infersight.probes.records import MOE_EXPERTS_PER_RECORD, RecordKind, record_dtype


#: Up to this many experts a layer is counted by comparing each routed id with every expert id and
#: summing (fused by inductor into one small kernel); above it by index_add_, whose scatter inductor
#: leaves to an ATen call on CPU. Measured on the CPU path (4 layers, decode batches of 4 tokens):
#: compare-and-sum added ~5 us a step at 4 experts where index_add_ added ~60 us.
COMPARE_MAX_EXPERTS = 32


class ExpertCounter:
    """Tokens routed to each (layer row, expert) since the last step boundary, on ``device``.

    ``rows`` are the counter's own dense layer indices; ``layer_ids`` maps them to the model's layer
    numbers (what the MOE records carry). Each token counts once per expert it is routed to, so a
    layer's row sums to top_k x tokens forwarded."""

    def __init__(self, layer_ids: list[int], n_experts: int, device: torch.device | str = "cpu") -> None:
        if not layer_ids or n_experts < 1:
            raise ValueError(f"need at least one layer and one expert, got {len(layer_ids)} layers, {n_experts} experts")
        self.layer_ids = list(layer_ids)
        self.n_experts = n_experts
        self.counts = torch.zeros((len(layer_ids), n_experts), dtype=torch.int64, device=device)
        self._saved = torch.zeros_like(self.counts)
        self._expert_ids = torch.arange(n_experts, device=device)
        self._compare = n_experts <= COMPARE_MAX_EXPERTS

    def count(self, row: int, topk_ids: torch.Tensor) -> None:
        """Add one layer's routing decision: ``topk_ids`` [tokens, top_k], the experts each token goes
        to. Static shapes only (no bincount, whose length depends on the data), so Dynamo can put it
        in a full graph; ``_compare`` is fixed at construction, so tracing bakes one branch."""
        if self._compare:
            self.counts[row] += (topk_ids.reshape(-1, 1) == self._expert_ids).sum(0)
        else:
            flat = topk_ids.reshape(-1)
            self.counts[row].index_add_(0, flat, torch.ones_like(flat, dtype=torch.int64))

    def save(self) -> None:
        """Remember the counts before a forward that must not count (a dummy or profiling run)."""
        self._saved.copy_(self.counts)

    def restore(self) -> None:
        """Undo everything counted since ``save``."""
        self.counts.copy_(self._saved)


class MoeRecords:
    """One step's counts as MOE probe records: one per (layer, block of MOE_EXPERTS_PER_RECORD
    experts). Allocated once; ``fill`` writes only the step id and the counts (a few numpy calls,
    whatever the number of layers)."""

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
        """The records of ``counts`` [layers, experts] for ``step_id`` (a view, valid until the next fill)."""
        per = MOE_EXPERTS_PER_RECORD
        self.records["step_id"] = step_id
        for b in range(self.blocks):
            width = min(per, self.n_experts - b * per)
            np.copyto(self._counts[b::self.blocks, :width], counts[:, b * per:b * per + width], casting="unsafe")
        return self.records


def moe_records(step_id: int, layer_ids: list[int], counts: np.ndarray) -> np.ndarray:
    """One step's [layers, experts] counts as MOE probe records (a fresh array)."""
    return MoeRecords(layer_ids, counts.shape[1]).fill(step_id, counts).copy()


class StepCopies:
    """Hands one step's counts to the host and zeroes them, without waiting on the device (the
    ProbeObserver pattern). CUDA: a non-blocking copy into one of two pinned buffers; ``publish``
    returns the *previous* step's records, whose copy finished long ago. CPU: the counts already
    live in host memory, so ``publish`` reads them through a numpy view and returns this step's."""

    def __init__(self, counter: ExpertCounter) -> None:
        self.counter = counter
        self.records = MoeRecords(counter.layer_ids, counter.n_experts)
        self.on_cuda = counter.counts.is_cuda
        self._view = None if self.on_cuda else counter.counts.numpy()  # shares the tensor's memory
        self._host = ([torch.zeros(counter.counts.shape, dtype=torch.int64, pin_memory=True) for _ in range(2)]
                      if self.on_cuda else [])
        self._flip = 0
        self._pending: tuple[int, torch.Tensor, torch.cuda.Event] | None = None

    def publish(self, step_id: int) -> np.ndarray | None:
        """Take this step's counts (the device counter restarts from zero); returns MOE records
        ready to write, or None (the first CUDA step, whose copy is still in flight)."""
        if self._view is not None:
            out = self.records.fill(step_id, self._view)
            self._view.fill(0)
            return out
        self._flip ^= 1
        buf = self._host[self._flip]
        buf.copy_(self.counter.counts, non_blocking=True)
        self.counter.counts.zero_()
        event = torch.cuda.Event()
        event.record()
        ready, self._pending = self._pending, (step_id, buf, event)
        return self._finish(ready)

    def flush(self) -> np.ndarray | None:
        """The records of the copy still in flight, waited for (at shutdown)."""
        ready, self._pending = self._pending, None
        return self._finish(ready)

    def _finish(self, ready: tuple[int, torch.Tensor, torch.cuda.Event] | None) -> np.ndarray | None:
        if ready is None:
            return None
        step_id, buf, event = ready
        event.synchronize()  # recorded one step ago: already complete, so this does not wait
        return self.records.fill(step_id, buf.numpy())


class HookTimes:
    """What the plugin itself costs, measured in its own hooks: wall time (perf_counter_ns) and, as
    other work may share the cores, this thread's CPU time (thread_time_ns: preemption does not
    count). Per real step: ``boundary`` = the root's pre- and post-forward hooks (snapshot, zero,
    ring write); ``count`` = the per-layer counting where it runs as Python (eager mode; under
    torch.compile it is part of the compiled graph and shows only in ``forward``); ``forward`` =
    the model's forward between the hooks."""

    FIELDS = ("boundary_ns", "boundary_cpu_ns", "count_ns", "count_cpu_ns", "forward_ns", "forward_cpu_ns")

    def __init__(self) -> None:
        self.steps = self.count_calls = 0
        self.totals = dict.fromkeys(self.FIELDS, 0)

    @staticmethod
    def now() -> tuple[int, int]:
        return time.perf_counter_ns(), time.thread_time_ns()

    def add(self, name: str, start: tuple[int, int], end: tuple[int, int]) -> None:
        """Add the interval start..end (two ``now()`` readings) to ``name`` (boundary, count, forward)."""
        self.totals[f"{name}_ns"] += end[0] - start[0]
        self.totals[f"{name}_cpu_ns"] += end[1] - start[1]

    def as_dict(self) -> dict[str, float]:
        steps, t = max(1, self.steps), self.totals
        hook_cpu = t["boundary_cpu_ns"] + t["count_cpu_ns"]
        return {"steps": self.steps, "count_calls": self.count_calls, **t,
                "hook_us_per_step": (t["boundary_ns"] + t["count_ns"]) / steps / 1e3,
                "hook_cpu_us_per_step": hook_cpu / steps / 1e3,
                "forward_us_per_step": t["forward_ns"] / steps / 1e3,
                "forward_cpu_us_per_step": t["forward_cpu_ns"] / steps / 1e3,
                "hook_cpu_share_of_forward": hook_cpu / t["forward_cpu_ns"] if t["forward_cpu_ns"] else 0.0}
