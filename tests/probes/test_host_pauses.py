"""HostPauses on this process's own collector, and the observer writing what it timed.

The collector runs on its own only when told to here (gc.collect() with automatic collection off),
so every pause taken is one the test caused; its `collected` is checked against gc.collect()'s own
return value, its times against a clock the test hands out."""
from __future__ import annotations

import gc
import itertools

import pytest
from testkit import collector_paused

from infersight.probes.config import ProbeConfig
from infersight.probes.host_pauses import HostPauses
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import RecordKind, RequestEvent, record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime.stats import StepStats

_names = itertools.count()


def cycles(n: int) -> None:
    """n unreachable reference cycles of two lists each (2n objects for the collector to free)."""
    for _ in range(n):
        a: list = []
        b: list = [a]
        a.append(b)


class Ticks:
    """A clock of the test's: each read returns the next value."""

    def __init__(self, *values_ns: int) -> None:
        self.values = iter(values_ns)

    def __call__(self) -> int:
        return next(self.values)


def test_a_collection_is_timed_with_its_generation_and_what_it_freed() -> None:
    with collector_paused():
        pauses = HostPauses(0.0)
        try:
            gc.collect()  # what earlier tests left, not counted below
            pauses.take()
            cycles(500)
            freed = gc.collect()
            gc.collect(0)
            (full, young), missed = pauses.take()
        finally:
            pauses.close()
    assert (full[2], full[3], young[3], missed) == (freed, 2, 0, 0) and freed >= 1000
    assert full[0] <= full[1] <= young[0] <= young[1]


def test_only_collections_of_at_least_the_minimum_are_kept() -> None:
    # Three collections on the test's clock: 0.4 ms, 2 ms, exactly 1 ms; the minimum is 1 ms.
    with collector_paused():
        pauses = HostPauses(0.001, clock_ns=Ticks(0, 400_000, 1_000_000, 3_000_000, 5_000_000, 6_000_000))
        try:
            assert not pauses
            for _ in range(3):
                gc.collect(0)
            assert pauses
            got, missed = pauses.take()
        finally:
            pauses.close()
    assert [(start, end) for start, end, _, _ in got] == [(1_000_000, 3_000_000), (5_000_000, 6_000_000)]
    assert missed == 0 and not pauses and pauses.take() == ([], 0)


def test_past_its_bound_the_oldest_go_and_are_counted() -> None:
    with collector_paused():
        pauses = HostPauses(0.0, held=2, clock_ns=Ticks(*range(0, 100, 10)))
        try:
            for _ in range(4):
                gc.collect(0)
            got, missed = pauses.take()
            gc.collect(0)  # nothing held after a take: none missed
        finally:
            pauses.close()
    assert [(s, e) for s, e, _, _ in got] == [(40, 50), (60, 70)] and missed == 2


def test_closed_it_times_nothing_more() -> None:
    pauses = HostPauses(0.0)
    pauses.close()
    assert pauses._on_gc not in gc.callbacks
    with collector_paused():
        gc.collect(0)
    assert pauses.take() == ([], 0)
    pauses.close()  # twice: no error


def test_a_negative_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="host_pause_min_s must be >= 0"):
        ProbeConfig(ring_name="x", host_pause_min_s=-1.0)
    with pytest.raises(ValueError, match=">= 0 s"):
        HostPauses(-0.5)


def test_the_observer_writes_a_requests_pauses_before_its_finish_and_at_step_ends() -> None:
    obs = ProbeObserver(ProbeConfig(ring_name=f"infersight-hp-{next(_names)}-{id(object())}", nvtx=False,
                                    host_pause_min_s=0.0))
    consumer = RingConsumer.attach(obs.ring_name, record_registry())
    try:
        with collector_paused():
            gc.collect()
            obs.on_step_end(StepStats(1, 0, 1))  # what the first collection left: written, read, dropped
            consumer.read()
            obs.on_request_arrived(1, 10, 4, None, 7)
            cycles(100)
            freed = gc.collect()
            obs.on_request_finished(1, 20, "length", 3)
            at_finish = consumer.read()
            gc.collect(1)
            obs.on_step_end(StepStats(2, 30, 40))
            at_step = consumer.read()
    finally:
        consumer.close()
        obs.close()
    (pause,) = at_finish[RecordKind.HOST_PAUSE]
    assert at_finish[RecordKind.REQUEST]["event"].tolist() == [RequestEvent.ARRIVED, RequestEvent.FINISHED]
    assert (pause["collected"], pause["generation"], pause["missed"]) == (freed, 2, 0)
    assert pause["ts_ns"] <= pause["end_ns"]
    (later,) = at_step[RecordKind.HOST_PAUSE]
    assert later["generation"] == 1 and later["ts_ns"] >= pause["end_ns"]
    assert obs.host_pauses is not None and obs.host_pauses._on_gc not in gc.callbacks  # closed with it


def test_pauses_can_be_left_untimed() -> None:
    obs = ProbeObserver(ProbeConfig(ring_name=f"infersight-hp-{next(_names)}-{id(object())}", nvtx=False,
                                    host_pause_min_s=None))
    consumer = RingConsumer.attach(obs.ring_name, record_registry())
    try:
        with collector_paused():
            gc.collect()
            obs.on_step_end(StepStats(1, 0, 1))
        assert obs.host_pauses is None and RecordKind.HOST_PAUSE not in consumer.read()
    finally:
        consumer.close()
        obs.close()
