"""Named ranges around the engine's phases (step, forwards, layers, sampling, KV swap).

The runtime only says where a phase begins and ends; what marks it (NVTX, torch.profiler's
record_function, nothing) is injected. The default marks nothing and costs one call returning a
shared null context. Names are stable: captures are attributed to phases and layers by them.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager


class RangeMarker:
    """Marks nothing. Probes subclass it (see infersight.probes.nvtx)."""

    _null: ContextManager[None] = contextlib.nullcontext()

    def range(self, name: str) -> ContextManager[None]:
        return self._null

    def begin_step(self, step_id: int) -> None:
        """Called at the start of each step, before its ranges (for per-step payloads)."""


def layer_range_names(layer_idx: int) -> dict[str, str]:
    """The per-layer range names, built once per layer rather than per forward."""
    prefix = f"layer.{layer_idx}"
    return {part: f"{prefix}.{part}" for part in ("attention", "moe.router", "moe.experts", "mlp")}
