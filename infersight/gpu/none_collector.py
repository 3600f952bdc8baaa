"""The collector for a machine without GPU telemetry: polls nothing and says why, once."""
from __future__ import annotations

from infersight.gpu.samples import GpuSample


class NoneCollector:
    """A clean no-op, so callers never branch on "is there a GPU?". `reasons` lists what was tried."""

    name = "none"

    def __init__(self, reasons: tuple[str, ...] = ()) -> None:
        self.reasons = reasons

    def poll(self) -> list[GpuSample]:
        return []

    def close(self) -> None:
        """Nothing to release."""

    def set_profiling_paused(self, paused: bool) -> None:
        """No counters are read, so none can conflict with a profiler."""

    def status_line(self) -> str:
        why = "; ".join(self.reasons) if self.reasons else "source=none in the configuration"
        return f"GPU telemetry: off ({why})"
