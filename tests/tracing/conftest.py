"""Tracing tests drive the real server (tests/serve/serve_fixtures.py) with torch on one thread."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))  # serve_fixtures, shared with tests/serve

from serve_fixtures import one_torch_thread  # noqa: E402


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield
