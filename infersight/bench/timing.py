"""Timing helpers shared by the benchmarks."""
from __future__ import annotations

import torch


def sync(device: str) -> None:
    """Wait for queued device work, so a wall-clock interval covers it (a no-op on CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
