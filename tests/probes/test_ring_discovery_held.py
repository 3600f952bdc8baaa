"""Discovery and rings another agent reads (probes.ring_discovery.RingDiscovery): such a ring is not
offered for attaching, is logged once however often discovery runs, is counted each time it is
found held again (at most once per recheck interval), and is offered as soon as its reader is gone;
held again later, it is logged again. The holder is a real RingConsumer holding the ring's lease;
the clock is the test's, so the counts are exact."""
from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from infersight.exporters.discovery import DiscoveryCollector
from infersight.probes.control import control_name
from infersight.probes.ring import RingConsumer, RingProducer
from infersight.probes.ring_discovery import RingDiscovery
from infersight.probes.schema import RecordType

STEP = RecordType(1, "token_step", 1, np.dtype([("ts_ns", "<u8"), ("step", "<u8"), ("n", "<u4")]))


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"infersight-test-held-{os.getpid()}-{uuid.uuid4().hex[:6]}-"
    yield p
    for name in os.listdir("/dev/shm"):
        if name.startswith(p):
            os.unlink(f"/dev/shm/{name}")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def warnings_about(caplog: pytest.LogCaptureFixture, name: str) -> int:
    return sum(1 for r in caplog.records if r.levelno == logging.WARNING and name in r.getMessage())


def test_a_held_ring_is_logged_once_then_counted_and_offered_when_free(prefix: str,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    held_name, free_name = prefix + "held", prefix + "free"
    clock = Clock()
    discovery = RingDiscovery(prefix, recheck_s=2.0, clock=clock)
    caplog.set_level(logging.INFO, logger="infersight.probes")
    with RingProducer.create(held_name, 8, None, [STEP]), RingProducer.create(free_name, 8, None, [STEP]):
        holder = RingConsumer.attach(held_name, [STEP])  # "another agent"
        try:
            polls = []
            for _ in range(50):  # 50 polls 0.1 s apart: 5 s, so checks at t = 100, 102, 104
                polls.append(discovery.candidates())
                clock.t += 0.1
            assert all(p == [free_name] for p in polls)
            assert warnings_about(caplog, held_name) == 1
            assert (discovery.skipped, discovery.held) == (3, 1)
            reg = CollectorRegistry()
            reg.register(DiscoveryCollector(discovery))
            assert reg.get_sample_value("infersight_probe_rings_held_elsewhere") == 1
            assert reg.get_sample_value("infersight_probe_ring_attach_skipped_total") == 3
            assert discovery.candidates(skip={free_name}) == []  # what the agent has attached is not checked
        finally:
            holder.close()
        clock.t += 2.0
        assert discovery.candidates() == [free_name, held_name]  # its reader gone: offered
        assert discovery.held == 0
        again = RingConsumer.attach(held_name, [STEP])
        try:
            assert discovery.candidates() == [free_name]
            assert warnings_about(caplog, held_name) == 2  # held anew: said anew
        finally:
            again.close()


def test_control_blocks_and_vanished_rings_are_left_out(prefix: str) -> None:
    name = prefix + "r"
    discovery = RingDiscovery(prefix, clock=Clock())
    with RingProducer.create(name, 8, None, [STEP]):
        with open(f"/dev/shm/{control_name(name)}", "wb") as f:
            f.write(b"\0" * 4096)
        holder = RingConsumer.attach(name, [STEP])
        try:
            assert discovery.candidates() == [] and discovery.held == 1
        finally:
            holder.close()
    if os.path.exists(f"/dev/shm/{name}"):
        os.unlink(f"/dev/shm/{name}")
    assert discovery.candidates() == [] and discovery.held == 0  # the ring is gone: forgotten
