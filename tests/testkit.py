"""Small helpers shared by test packages (imported as `testkit`; tests/conftest.py puts tests/ on the path)."""
from __future__ import annotations

import itertools
import os
import socket
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

_names = itertools.count()


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Engines in tests share two cores with agents, servers and Phoenix: oversubscribed torch
    threads crawl. A context manager rather than a fixture so module-scoped fixtures can use it."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def unique_ring(tag: str) -> str:
    return f"infersight-test-{tag}-{os.getpid()}-{next(_names)}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_process(proc, log: Callable[[], str], what: str, check: Callable[[], object],
                     timeout: float = 20.0, transient: tuple[type[BaseException], ...] = (OSError,)) -> object:
    """Poll check() until it returns something truthy; fail with the process's log if it exits or the
    time runs out. `transient` errors (a server not listening yet) are retried."""
    import pytest  # testkit is imported by non-test helpers too; pytest only where a test waits

    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except transient:
            pass
        if proc.poll() is not None:
            pytest.fail(f"the process exited ({proc.returncode}) while waiting for {what}:\n{log()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n{log()}")
        time.sleep(0.05)
