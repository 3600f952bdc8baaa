"""Puts tests/ on sys.path so test packages can share `testkit`, and acts on testkit's service marks."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testkit import require_service  # noqa: E402  (importable only once tests/ is on the path)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "service(name, present, reason): the test needs that service "
                                       "(testkit.needs_service): a failure under CI=true when absent, a skip elsewhere")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("service"):
        if not mark.kwargs["present"]:
            require_service(mark.kwargs["name"], mark.kwargs["reason"])
