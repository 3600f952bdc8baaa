"""Timing helpers shared by the benchmarks."""
from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from infersight.runtime import Engine
    from infersight.runtime.stats import StepStats


def sync(device: str) -> None:
    """Wait for queued device work, so a wall-clock interval covers it (a no-op on CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_step(engine: "Engine", device: str) -> tuple["StepStats", float]:
    """One engine step and its wall seconds, between device syncs (what a user waits for)."""
    sync(device)
    t0 = time.perf_counter()
    stats = engine.step()
    sync(device)
    return stats, time.perf_counter() - t0


def replay_ms(graph: "torch.cuda.CUDAGraph", replays: int) -> float:
    """Median device ms of one replay of a captured CUDA graph, by CUDA events around each."""
    times = []
    for _ in range(replays):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def captured(fn: Callable[[], object]) -> "torch.cuda.CUDAGraph":
    """fn run once (compiles, allocations), then captured as a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph
