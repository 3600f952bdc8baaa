"""Every test here limits torch to one thread (restored after): the engine thread competes for the cores."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from serve_fixtures import one_torch_thread


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield
