"""AgentClient: the agent's JSON API (/api/v1/...) over HTTP, each call bounded by McpConfig.timeout_s.

A tool's call to the agent never waits longer than the timeout and never holds anything of the
agent's: the MCP server is a separate process talking HTTP, so a stuck client cannot block the
agent's poll loop. Every failure (unreachable, timed out, a non-JSON answer, an HTTP error with the
agent's {"error": ...}) is an AgentError with one line saying what happened.
"""
from __future__ import annotations

from typing import Any

import httpx

#: The largest answer read from the agent (its slowest=10000 list is a few MB).
MAX_ANSWER_BYTES = 32 << 20


class AgentError(Exception):
    """A call to the agent failed; the message is for the MCP client (one line)."""


class AgentClient:
    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    async def _send(self, method: str, path: str, params: dict[str, Any] | None = None,
                    json_body: dict[str, Any] | None = None, token: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        try:
            # One client per call: tools run concurrently, and nothing is kept open to the agent.
            async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s) as client:
                answer = await client.request(method, path, params=params, json=json_body, headers=headers)
        except httpx.TimeoutException:
            raise AgentError(f"the agent at {self.base_url} did not answer {path} within {self.timeout_s:g} s"
                             ) from None
        except httpx.HTTPError as exc:
            why = f"{exc.__class__.__name__}: {exc}"[:240]
            raise AgentError(f"cannot reach the agent at {self.base_url}: {why}") from None
        if len(answer.content) > MAX_ANSWER_BYTES:
            raise AgentError(f"the agent's answer to {path} is over {MAX_ANSWER_BYTES >> 20} MiB")
        try:
            doc = answer.json()
        except ValueError:
            raise AgentError(f"the agent answered {path} with HTTP {answer.status_code} and no JSON") from None
        if answer.status_code >= 400:
            message = doc.get("error") if isinstance(doc, dict) else None
            raise AgentError(f"the agent refused {path} (HTTP {answer.status_code}): {message or answer.reason_phrase}")
        return doc

    async def get(self, path: str, **params: Any) -> Any:
        return await self._send("GET", path, params={k: v for k, v in params.items() if v is not None})

    async def post(self, path: str, body: dict[str, Any], token: str) -> Any:
        return await self._send("POST", path, json_body=body, token=token)
