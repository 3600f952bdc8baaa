"""RingSet with discovery and a ring another agent reads (after H's wiring of probes.ring_discovery
into agent/rings/ingest.py): the agent does not try to attach it, says so once however many polls pass,
counts it, and attaches as soon as the other reader has gone. Drop into tests/agent/."""
from __future__ import annotations

import logging
import os
import time
import uuid

import pytest

from infersight.agent.rings.ingest import RingSet
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer


def test_held_discovered_ring_is_logged_once_counted_then_attached(caplog: pytest.LogCaptureFixture) -> None:
    prefix = f"infersight-test-ringset-held-{os.getpid()}-{uuid.uuid4().hex[:6]}-"
    name = prefix + "r"
    caplog.set_level(logging.INFO)
    probe = ProbeObserver(ProbeConfig(ring_name=name, nvtx=False))  # an engine's ring
    try:
        holder = RingConsumer.attach(name, record_registry())  # another agent
        rings = RingSet([], True, retry_interval_s=0.2, prefix=prefix)
        try:
            start = time.monotonic()
            while time.monotonic() - start < 2.0:  # 40 polls, about 10 recheck intervals
                rings.refresh()
                time.sleep(0.05)
            warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and name in r.getMessage()]
            assert len(warnings) == 1 and "already read by agent pid" in warnings[0].getMessage()
            assert rings.attached == {} and rings.discovery.held == 1
            assert 5 <= rings.discovery.skipped <= 11  # one per 0.2 s recheck over 2 s, on a busy machine
        finally:
            holder.close()
        time.sleep(0.25)
        rings.refresh()
        assert list(rings.attached) == [name] and rings.discovery.held == 0
        rings.close()
    finally:
        probe.close()
