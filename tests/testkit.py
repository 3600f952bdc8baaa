"""Small helpers shared by test packages (imported as `testkit`; tests/conftest.py puts tests/ on the path)."""
from __future__ import annotations

import itertools
import os
import random
import socket
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, NoReturn

if TYPE_CHECKING:
    import pytest

_names = itertools.count()


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Engines in tests share two cores with agents, servers and Phoenix: oversubscribed torch
    threads crawl. A context manager rather than a fixture so module-scoped fixtures can use it."""
    import torch  # here, not at the top: tests/conftest.py imports testkit for every test

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off inside (gc.collect() still runs when called). In the suite's
    process a full collection scans everything earlier tests left alive and took 0.25-0.37 s
    (gc.callbacks, measured over tests/agent): the slow-request scenarios build one cause per victim,
    and a pause of the test's own process is not one of them (one landing in a victim's prefill step
    made a long answer 0.3 s slower outside its decode, and CI saw it unattributed); the host-pause
    tests count only the collections they call."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def services_required() -> bool:
    """True under CI (``CI=true``, as CI systems and .ci/run set it): a test's missing service is then
    a failure. A skip would leave the run green without testing what it claims to test."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def require_service(name: str, reason: str) -> NoReturn:
    """The one way a test gives up on a missing service (Prometheus, Chromium, Phoenix, vLLM): a
    failure under CI (services_required()), a skip elsewhere, saying why either way."""
    import pytest  # as in wait_for_process: pytest only where a test calls it

    if services_required():
        pytest.fail(f"{name} is required under CI=true and is not available: {reason}", pytrace=False)
    pytest.skip(f"needs {name}: {reason}")


def needs_service(name: str, present: bool, reason: str) -> "pytest.MarkDecorator":
    """A mark (for a test or a module's pytestmark) that sends a test without its service through
    require_service at setup (tests/conftest.py does it); like skipif, which can only skip."""
    import pytest

    return pytest.mark.service(name=name, present=present, reason=reason)


def unique_ring(tag: str) -> str:
    return f"infersight-test-{tag}-{os.getpid()}-{next(_names)}"


_ports_given: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A free 127.0.0.1 TCP port, never the same one twice in this process, taken below the kernel's
    ephemeral range where it can: a port from bind(0) is ephemeral, and while a slow server (a CPU
    vLLM takes minutes) starts on it, any outgoing connection of the test's other processes may take
    it first (seen in CI: vLLM's bind failed, "Address already in use")."""
    low = _ephemeral_low()
    if low > 20_500:
        rng = random.Random()
        for _ in range(200):
            port = rng.randrange(20_000, low)
            if port in _ports_given:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _ports_given.add(port)
            return port
    while True:  # no room below the ephemeral range: the kernel's choice, still never twice
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _ports_given:
            _ports_given.add(port)
            return port


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
