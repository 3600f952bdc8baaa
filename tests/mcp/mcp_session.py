"""The SDK's own client, driven from sync tests: a stdio session (spawning `infersight mcp`) or a
streamable-HTTP one (with or without the bearer token), each call's result kept as the client saw it."""
from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

Script = Callable[[Client], Awaitable[Any]]


def mcp_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "infersight", "mcp", *args]


def over_stdio(args: list[str], env: dict[str, str], cwd: str, script: Script) -> Any:
    params = StdioServerParameters(command=sys.executable, args=mcp_command(*args)[1:], env=env, cwd=cwd)

    async def main() -> Any:
        async with Client(params, read_timeout_seconds=120) as client:
            return await script(client)

    return asyncio.run(main())


def over_http(url: str, token: str, script: Script) -> Any:
    async def main() -> Any:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=120) as client:
            return await script(client)

    return asyncio.run(main())
