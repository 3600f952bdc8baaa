"""tracing.daemon_executor: calls run in submission order on daemon threads, results and exceptions
reach their futures, nothing is taken after shutdown, and queued calls can be cancelled."""
from __future__ import annotations

import threading

import pytest

from infersight.tracing.daemon_executor import DaemonThreadExecutor


def test_results_exceptions_order_and_shutdown() -> None:
    pool = DaemonThreadExecutor(1, "t")
    assert all(t.daemon for t in pool._threads)
    seen: list[int] = []
    futures = [pool.submit(seen.append, i) for i in range(5)]
    failing = pool.submit(lambda: 1 // 0)
    assert [f.result(timeout=5) for f in futures] == [None] * 5 and seen == [0, 1, 2, 3, 4]
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=5)
    gate = threading.Event()
    blocked = pool.submit(gate.wait)
    while not blocked.running():  # the worker holds it: only the next call is still queued
        threading.Event().wait(0.01)
    queued = pool.submit(seen.append, 99)
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(seen.append, 100)
    gate.set()
    assert blocked.result(timeout=5) is True and 99 not in seen
