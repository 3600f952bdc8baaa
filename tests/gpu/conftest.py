"""Shared fixture for the GPU telemetry tests: the real public samples in ../shared/fixtures."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"


@pytest.fixture
def shared_fixture() -> Callable[[str], str]:
    """Read a file from the shared fixtures folder, or skip (saying where it was looked for)."""
    def read(name: str) -> str:
        path = FIXTURES / name
        if not path.is_file():
            pytest.skip(f"shared fixture {path} is absent (the ../shared checkout is missing)")
        return path.read_text()
    return read
