"""`infersight mcp --transport streamable-http` behind the agent's token: no token (or a wrong one)
is 401 before the MCP app; with it, the SDK's client reads the summary and starts a capture, whose
analysis the `captures` tool then reads as the agent's API has it."""
from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp_live_agent import INIT, LiveAgent
from mcp_session import over_http
from testkit import one_torch_thread

from infersight.runtime import SamplingParams


@pytest.fixture(scope="module")
def http_server(live_agent: LiveAgent) -> str:
    return live_agent.mcp_url


def test_no_token_or_a_wrong_one_is_401(http_server: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic eDp5"}):
        accept = {"Accept": "application/json, text/event-stream"}
        answer = httpx.post(http_server, json=INIT, headers={**accept, **headers})
        assert answer.status_code == 401 and "bearer token" in answer.json()["error"]
        assert answer.headers["www-authenticate"] == "Bearer"


def test_with_the_token_a_capture_is_started_and_its_analysis_read(http_server: str, live_agent: LiveAgent) -> None:
    token = live_agent.token_file.read_text().strip()

    async def start(client: Client) -> tuple[Any, Any]:
        summary = await client.call_tool("summary", {})
        capture = await client.call_tool("start_capture", {"steps": 2, "tool": "torch"})
        return summary, capture

    summary, capture = over_http(http_server, token, start)
    assert not summary.is_error and summary.structured_content["requests"] == \
        live_agent.api("/api/v1/summary")["requests"]
    assert not capture.is_error, capture.content
    record = capture.structured_content
    assert record["state"] == "requested" and record["steps"] == 2
    # The engine's next steps are captured: run two requests through it, kept in the session's workload
    # record (its prompts and steps) like the rest, so the other tests' expected values stay exact.
    work = live_agent.work
    with one_torch_thread():
        for prompt in ("capture me", "and me too"):
            rid = work.engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                                 task="json"))
            work.prompts[rid] = (prompt, "json")
        while work.engine.has_unfinished():
            work.steps.append(work.engine.step())
    deadline = time.monotonic() + 60
    while True:
        api = [c for c in live_agent.api("/api/v1/captures")["captures"] if c["capture_id"] == record["capture_id"]]
        if api and api[0]["state"] in ("done", "failed") and (api[0]["analysis"] is not None or
                                                              api[0]["state"] == "failed"):
            break
        assert time.monotonic() < deadline, api
        time.sleep(0.2)
    wait_for_rows = time.monotonic() + 30
    while live_agent.api("/api/v1/summary")["requests"] < len(work.prompts):
        assert time.monotonic() < wait_for_rows, "the agent did not report the capture's requests"
        time.sleep(0.2)
    read = over_http(http_server, token, lambda c: c.call_tool("captures", {"capture_id": record["capture_id"]}))
    assert not read.is_error, read.content
    (mine,) = read.structured_content["captures"]
    assert {k: mine[k] for k in ("capture_id", "state", "path", "analysis", "steps")} == \
        {k: api[0][k] for k in ("capture_id", "state", "path", "analysis", "steps")}
    assert mine["state"] == "done"
