"""GpuSampler with scripted collectors: bounded ring, latest per series, per-collector error
counts, fixed-rate thread that stops cleanly and closes its collector."""
from __future__ import annotations

import threading
import time

import pytest

from infersight.gpu.sampler import GpuSampler
from infersight.gpu.samples import GpuCollector, GpuSample


class Scripted:
    """Each poll returns the next item of `script`; an Exception item is raised instead."""

    name = "scripted"

    def __init__(self, script: list[list[GpuSample] | Exception]) -> None:
        self.script = script
        self.polls = 0
        self.closed = 0

    def poll(self) -> list[GpuSample]:
        item = self.script[min(self.polls, len(self.script) - 1)]
        self.polls += 1
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self.closed += 1

    def status_line(self) -> str:
        return "GPU telemetry: scripted"


def s(field: str, value: float, ts: int, gpu: int = 0, instance: str = "") -> GpuSample:
    return GpuSample(gpu, f"GPU-{gpu}", field, value, ts, instance)


def test_ring_is_bounded_latest_is_per_series_and_errors_are_counted() -> None:
    script: list[list[GpuSample] | Exception] = [
        [s("power_watts", 100.0, 1), s("power_watts", 50.0, 1, gpu=1)],
        RuntimeError("scrape failed"),
        [s("power_watts", 110.0, 3), s("tensor_active_ratio", 0.5, 3)],
        [s("tensor_active_ratio", 0.6, 4), s("tensor_active_ratio", 0.9, 4, instance="2")],
        ValueError("garbage"),
    ]
    collector = Scripted(script)
    assert isinstance(collector, GpuCollector)
    sampler = GpuSampler(collector, interval_s=1.0, ring_size=4)
    stored = [sampler.poll_once() for _ in range(5)]
    assert stored == [2, 0, 2, 2, 0]
    # The ring keeps the newest 4 of the 6 samples stored.
    assert [(x.field, x.value) for x in sampler.recent()] == [
        ("power_watts", 110.0), ("tensor_active_ratio", 0.5), ("tensor_active_ratio", 0.6),
        ("tensor_active_ratio", 0.9)]
    latest = {(x.gpu, x.instance, x.field): x.value for x in sampler.latest()}
    assert latest == {(0, "", "power_watts"): 110.0, (1, "", "power_watts"): 50.0,
                      (0, "", "tensor_active_ratio"): 0.6, (0, "2", "tensor_active_ratio"): 0.9}
    assert sampler.error_counts() == {"scripted": 2}
    line = sampler.status_line()
    assert line.startswith("GPU telemetry: scripted; 3 polls every 1 s, 2 failed") and "ValueError: garbage" in line


def test_thread_polls_at_the_interval_and_stop_closes() -> None:
    collector = Scripted([[s("power_watts", 1.0, 0)]])
    sampler = GpuSampler(collector, interval_s=0.1).start()
    sampler.start()  # idempotent while running
    time.sleep(0.55)
    sampler.stop()
    assert 3 <= collector.polls <= 8 and collector.closed == 1  # ~6 at 0.1 s; slack for a busy CI
    assert len([t for t in threading.enumerate() if t.name.startswith("gpu-sampler")]) == 0


def test_a_slow_poll_does_not_block_readers() -> None:
    gate = threading.Event()

    class Slow(Scripted):
        def poll(self) -> list[GpuSample]:
            gate.wait(2.0)
            return [s("power_watts", 1.0, 0)]

    sampler = GpuSampler(Slow([]), interval_s=0.1).start()
    try:
        time.sleep(0.05)  # the thread is now inside poll()
        t0 = time.monotonic()
        assert sampler.latest() == [] and sampler.recent() == [] and sampler.error_counts() == {"scripted": 0}
        assert time.monotonic() - t0 < 0.05
    finally:
        gate.set()
        sampler.stop()


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        GpuSampler(Scripted([[]]), interval_s=0)
    with pytest.raises(ValueError):
        GpuSampler(Scripted([[]]), ring_size=0)


class Pausable(Scripted):
    """Records set_profiling_paused calls with the thread that made them."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__([[]])
        self.fail = fail
        self.pauses: list[tuple[bool, str]] = []

    def set_profiling_paused(self, paused: bool) -> None:
        self.pauses.append((paused, threading.current_thread().name))
        if self.fail:
            raise RuntimeError("host engine refused")


def test_pause_is_applied_once_per_change_before_the_next_poll() -> None:
    c = Pausable()
    sampler = GpuSampler(c, interval_s=60)
    sampler.pause_profiling(True)
    sampler.pause_profiling(True)
    assert c.pauses == [] and not sampler.profiling_paused  # applied on the polling side, not here
    sampler.poll_once()
    sampler.poll_once()
    assert [p for p, _ in c.pauses] == [True] and sampler.profiling_paused
    sampler.pause_profiling(False)
    sampler.poll_once()
    assert [p for p, _ in c.pauses] == [True, False] and not sampler.profiling_paused


def test_the_thread_applies_a_pause_at_once_not_at_the_next_poll() -> None:
    c = Pausable()
    sampler = GpuSampler(c, interval_s=60).start()
    deadline = time.monotonic() + 5
    while c.polls == 0 and time.monotonic() < deadline:  # the first poll happens at start
        time.sleep(0.01)
    sampler.pause_profiling(True)
    while not c.pauses and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert c.pauses == [(True, "gpu-sampler-scripted")] and c.polls == 1  # no extra poll, no 60 s wait


def test_a_collector_that_cannot_pause_is_named_in_the_note() -> None:
    plain, failing = GpuSampler(Scripted([[]]), interval_s=60), GpuSampler(Pausable(fail=True), interval_s=60)
    for sampler in (plain, failing):
        sampler.pause_profiling(True)
        sampler.poll_once()  # never raises: the capture goes on
    assert "dcgmi profile --pause" in plain.pause_note
    assert failing.pause_note == "could not pause profiling metrics: host engine refused"


def test_stop_takes_a_final_reading_once_and_a_second_stop_does_nothing() -> None:
    collector = Scripted([[s("energy_joules", 1.0, 0)], [s("energy_joules", 2.0, 0)]])
    sampler = GpuSampler(collector, interval_s=60)
    sampler.poll_once()
    sampler.stop(final_poll=True)
    assert collector.polls == 2 and collector.closed == 1
    assert [x.value for x in sampler.recent()] == [1.0, 2.0]
    sampler.stop(final_poll=True)  # already stopped: no poll on a closed collector, no second close
    assert collector.polls == 2 and collector.closed == 1
