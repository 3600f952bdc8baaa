"""Puts tests/ on sys.path so test packages can share `testkit`, acts on testkit's service marks, and
holds the fixtures that test directories share (a service started once per session); what
collection imported is frozen out of the cyclic collector (shorter pauses in timed tests)."""
from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testkit import require_service  # noqa: E402  (importable only once tests/ is on the path)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "service(name, present, reason): the test needs that service "
                                       "(testkit.needs_service): a failure under CI=true when absent, a skip elsewhere")


def pytest_collection_finish(session: pytest.Session) -> None:
    # What collection imported (torch, pandas, every test module) lives as long as the session: moved
    # out of the collector's reach, as vLLM does after start-up. Full collections then scan only what
    # tests made, and the pauses they put into timed tests halved (over tests/agent, gc.callbacks:
    # 0.25-0.37 s before, 0.10-0.20 s after).
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    # Handed back before the interpreter exits: objects left frozen are never finalised, and
    # triton's bindings then report them as leaks on the way out.
    gc.unfreeze()


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("service"):
        if not mark.kwargs["present"]:
            require_service(mark.kwargs["name"], mark.kwargs["reason"])


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Phoenix for the session (tests/phoenix_server.py), shared by tests/tracing and
    tests/vllm: each reads back its own trace's spans only."""
    from phoenix_server import running_phoenix  # imported on use: most sessions never start Phoenix

    with running_phoenix(tmp_path_factory.mktemp("phoenix")) as url:
        yield url
