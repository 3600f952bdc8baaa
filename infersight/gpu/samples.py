"""The one shape every GPU collector produces, and the interface a collector implements.

A collector turns whatever it reads (DCGM field values, a dcgm-exporter scrape, NVML calls) into
`GpuSample`s in base units: ratios 0..1, bytes, bytes per second, watts, hertz, joules, celsius.
Field names are the suffixes of the `infersight_gpu_*` metrics (see `fields.py`), so a sample's
field is also the metric it feeds. Timestamps are `time.monotonic_ns()` of the process that
polled, the same clock the engine stamps its steps with (CLOCK_MONOTONIC is host-wide on Linux).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One normalised reading of one field on one GPU (or one MIG GPU instance of it).

    gpu: the device index; uuid: "GPU-..." when the source knows it, else "";
    instance: the MIG GPU-instance id ("" for the whole GPU); ts_ns: monotonic ns at the poll.
    """

    gpu: int
    uuid: str
    field: str
    value: float
    ts_ns: int
    instance: str = ""


@runtime_checkable
class GpuCollector(Protocol):
    """What the sampler drives. `poll` may raise: the sampler counts and logs the error and keeps
    polling, so a collector never has to swallow its own failures. `close` releases handles."""

    name: str

    def poll(self) -> list[GpuSample]:
        """Read every field once; samples carry the time of this poll."""
        ...

    def close(self) -> None:
        """Release library handles; safe to call twice."""
        ...

    def status_line(self) -> str:
        """One line for humans: which source, how many GPUs, and what is missing."""
        ...

    # Optional: set_profiling_paused(paused: bool) -> None stops reading profiler-grade counters
    # (GPM, DCGM profiling fields) while a capture runs; GpuSampler.pause_profiling calls it.
