"""Small helpers shared by test packages (imported as `testkit`; tests/conftest.py puts tests/ on the path)."""
from __future__ import annotations

import itertools
import os
import socket
from contextlib import contextmanager
from typing import Iterator

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
