"""Per-layer expert-parallel statistics: phase clocks, and the collector that hands one step's
stats to the observer.

On CPU a phase mark is time.monotonic_ns(). On CUDA it is a timing event recorded on the current
stream, so marking never waits for the device; events are read once per step, in flush(), after
sampling has synchronised anyway. NCCL collectives called synchronously make the current stream
wait for them, so an event recorded after a collective completes after it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence, Union

import torch

Mark = Union[int, "torch.cuda.Event"]


@dataclass(frozen=True)
class EPLayerStats:
    """One MoE layer's expert-parallel work on one rank in one step.

    dispatch_ns: pair planning, the counts all-to-all and the rows all-to-all (layer.N.moe.dispatch).
    compute_ns: the local experts (layer.N.moe.experts). combine_ns: the rows all-to-all back and the
    weighted sum over each token's experts (layer.N.moe.combine). gather_ns: the all-gather that
    re-replicates the output (layer.N.moe.gather). total_ns: the whole MoE forward, router included.
    bytes_to_peer[p]: activation bytes this rank dispatched to rank p (own rank: a local copy); in
    combine rank p sends the same rows back. expert_ids/expert_tokens: per local slot, the global
    expert id and the tokens it received from all ranks."""

    step_id: int
    layer: int
    rank: int
    world: int
    dispatch_ns: int
    compute_ns: int
    combine_ns: int
    gather_ns: int
    total_ns: int
    bytes_to_peer: tuple[int, ...]
    expert_ids: tuple[int, ...]
    expert_tokens: tuple[int, ...]


class PhaseClock:
    """mark() now; ns(a, b) the time between two marks (valid once the later one has completed)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def mark(self) -> Mark:
        if not self.cuda:
            return time.monotonic_ns()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ns(self, start: Mark, end: Mark) -> int:
        if isinstance(start, int) and isinstance(end, int):
            return end - start
        end.synchronize()  # type: ignore[union-attr]
        return int(start.elapsed_time(end) * 1e6)  # type: ignore[union-attr]


@dataclass(frozen=True)
class _Pending:
    layer: int
    marks: tuple[Mark, ...]  # start, dispatch start/end, compute end, combine end, gather start/end, end
    bytes_to_peer: tuple[int, ...]
    expert_ids: tuple[int, ...]
    expert_tokens: tuple[int, ...]


class EPStatsCollector:
    """Shared by the layers of one engine: they record() during the forward, the engine flush()es
    after each step."""

    def __init__(self, rank: int, world: int, device: str) -> None:
        self.rank, self.world = rank, world
        self.clock = PhaseClock(device)
        self._pending: list[_Pending] = []

    def record(self, layer: int, marks: tuple[Mark, ...], bytes_to_peer: Sequence[int],
               expert_ids: Sequence[int], expert_tokens: Sequence[int]) -> None:
        self._pending.append(_Pending(layer, marks, tuple(bytes_to_peer), tuple(expert_ids), tuple(expert_tokens)))

    def flush(self, step_id: int, sink: object) -> list[EPLayerStats]:
        """Resolve this step's marks, hand each layer's stats to sink.on_ep_stats (when the sink has
        that method), and return them."""
        pending, self._pending = self._pending, []
        ns = self.clock.ns
        out = []
        for p in pending:
            start, d0, d1, c1, m1, g0, g1, end = p.marks
            out.append(EPLayerStats(step_id, p.layer, self.rank, self.world, ns(d0, d1), ns(d1, c1), ns(c1, m1),
                                    ns(g0, g1), ns(start, end), p.bytes_to_peer, p.expert_ids, p.expert_tokens))
        emit = getattr(sink, "on_ep_stats", None)
        if emit is not None:
            for s in out:
                emit(s.step_id, s.layer, s.rank, s.world, s.dispatch_ns, s.combine_ns, s.compute_ns,
                     s.bytes_to_peer, s.expert_tokens, s.expert_ids, gather_ns=s.gather_ns, total_ns=s.total_ns)
        return out
