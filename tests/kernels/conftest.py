"""Fixture files for tests/kernels, and expected values computed from the raw files alone.

The public captures live outside the repository (read PROVENANCE.md there) and are never copied
in; a test that needs one is skipped when it is absent. Our own H200 capture is in data/.
Everything "expected" here is derived with json / Decimal, never with infersight.kernels.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

import pytest

from infersight.kernels.frames import KernelTrace
from infersight.kernels.readers.kineto import load_kineto

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
DATA = Path(__file__).resolve().parent / "data"
OUR_TRACE = DATA / "kineto_tiny-moe.json.gz"


def _shared(name: str) -> Path:
    path = FIXTURES / name
    if not path.exists():
        pytest.skip(f"public fixture {name} is not present in {FIXTURES} (see PROVENANCE.md there)")
    return path


@pytest.fixture
def shared_fixture() -> Callable[[str], Path]:
    """shared_fixture("name") -> its path, or the test is skipped."""
    return _shared


def raw_events(path: Path) -> list[dict[str, Any]]:
    """traceEvents with floats as Decimal, so µs -> ns is exact here too."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f, parse_float=Decimal)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


@pytest.fixture
def kineto_events() -> Callable[[Path], list[dict[str, Any]]]:
    """kineto_events(path) -> the raw traceEvents (floats as Decimal)."""
    return raw_events


@dataclass(frozen=True)
class OurCapture:
    trace: KernelTrace
    events: list[dict[str, Any]]


@pytest.fixture(scope="session")
def our_capture() -> OurCapture:
    """Our H200 capture, parsed once by the tool and once as raw JSON."""
    return OurCapture(load_kineto(OUR_TRACE), raw_events(OUR_TRACE))
