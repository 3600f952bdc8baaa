"""The live agent beside the engine, started once for the MCP tests (mcp_live_agent.py)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from mcp_live_agent import LiveAgent, start_live_agent


@pytest.fixture(scope="session")
def live_agent(tmp_path_factory) -> Iterator[LiveAgent]:
    with start_live_agent(tmp_path_factory.mktemp("mcp")) as agent:
        yield agent
