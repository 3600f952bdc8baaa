"""Timing helpers shared by the benchmarks."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

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
