"""The agent's HTTP surface under bad input, on a real uvicorn with the agent's limits: the capture
endpoint's numbers that are not integers (1e999, -1e999, true, "20") and deep or huge bodies get a
JSON 400/413, never a 500; the Bearer scheme matches in any case (RFC 7235) and a wrong or
non-ASCII credential is a 401; 404 and 405 are JSON too. A stand-in CaptureSurface records what
reaches it, so the test knows exactly which requests got through."""
from __future__ import annotations

import json

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from asgi_server import running
from prometheus_client import CollectorRegistry

from infersight.agent.capture.controller import CaptureRecord
from infersight.agent.config import AgentConfig
from infersight.agent.api.server import AGENT_LIMITS, bearer_matches, build_app
from infersight.agent.state import AgentState

TOKEN = "s3cret-token"


@dataclass
class Surface:
    token: str = TOKEN
    calls: list[tuple[int, str]] = field(default_factory=list)
    decodes: list[str | None] = field(default_factory=list)

    def request_capture(self, steps: int, tool: str, reason: str = "api", decode: str | None = None) -> CaptureRecord:
        if not 1 <= steps <= 1000:
            raise ValueError(f"steps must be in 1..1000, got {steps}")
        self.calls.append((steps, tool))
        self.decodes.append(decode)
        return CaptureRecord(len(self.calls), "ring", steps, tool, reason, time.time())

    @property
    def capture_records(self) -> list[CaptureRecord]:
        return []


@pytest.fixture(scope="module")
def agent() -> Iterator[tuple[str, Surface]]:
    surface = Surface()
    app = build_app(AgentState(AgentConfig(rings=["unused"])), CollectorRegistry(), surface)
    with running(app, **AGENT_LIMITS.uvicorn_options()) as (url, _):
        yield url, surface


def capture(url: str, content: bytes, auth: str = f"Bearer {TOKEN}") -> httpx.Response:
    return httpx.post(url + "/api/v1/capture", content=content, timeout=30,
                      headers={"authorization": auth, "content-type": "application/json"})


@pytest.mark.parametrize("raw, message", [
    (b'{"steps": 1e999}', "bad capture request: steps must be an integer, got Infinity"),
    (b'{"steps": -1e999}', "bad capture request: steps must be an integer, got -Infinity"),
    (b'{"steps": NaN}', "bad capture request: steps must be an integer, got NaN"),
    (b'{"steps": true}', "bad capture request: steps must be an integer, got true"),
    (b'{"steps": "20"}', 'bad capture request: steps must be an integer, got "20"'),
    (b'{"steps": 2.5}', "bad capture request: steps must be an integer, got 2.5"),
    (b'{"steps": 0}', "bad capture request: steps must be in 1..1000, got 0"),
    (b'{"steps": 5, "tool": 7}', "bad capture request: tool must be a string, got 7"),
    (b'{"steps": 5, "decode": "fast"}', "bad capture request: decode must be 'eager' or 'graphs', got \"fast\""),
    (b'{"steps": 5, "decode": 1}', "bad capture request: decode must be 'eager' or 'graphs', got 1"),
    (b'[1, 2]', "bad capture request: the body must be a JSON object"),
    (b'{"steps": ', "bad capture request: Expecting value: line 1 column 11 (char 10)"),
    (b'{"a": ' + b'[' * 50_000, "request body nests JSON deeper than 16 levels"),
])
def test_bad_capture_bodies_are_400_json(agent, raw: bytes, message: str) -> None:  # noqa: ANN001
    url, surface = agent
    before = len(surface.calls)
    resp = capture(url, raw)
    assert resp.status_code == 400 and resp.json() == {"error": message}
    assert len(surface.calls) == before


@pytest.mark.parametrize("body, decode", [({"steps": 4}, None), ({"steps": 4, "decode": "graphs"}, "graphs"),
                                          ({"steps": 4, "tool": "torch", "decode": "eager"}, "eager")])
def test_capture_decode_mode_is_passed_to_the_agent(agent, body: dict, decode: str | None) -> None:  # noqa: ANN001
    url, surface = agent
    resp = capture(url, json.dumps(body).encode())
    assert resp.status_code == 202 and surface.decodes[-1] == decode


def test_huge_body_is_413(agent) -> None:  # noqa: ANN001
    url, surface = agent
    resp = capture(url, b'{"steps": 5, "pad": "' + b"x" * (5 << 20) + b'"}')
    assert resp.status_code == 413 and resp.json() == {"error": f"request body exceeds {64 << 10} bytes"}


@pytest.mark.parametrize("auth, status", [
    (f"Bearer {TOKEN}", 202), (f"bearer {TOKEN}", 202), (f"BEARER {TOKEN}", 202), (f"bEaReR   {TOKEN}", 202),
    ("Bearer wrong", 401), (f"Basic {TOKEN}", 401), (TOKEN, 401), ("", 401), ("Bearer", 401),
    ("Bearer s3cret-tok\u00e9n", 401),  # not ASCII: compared as bytes, a mismatch (was a TypeError)
])
def test_bearer_scheme_is_case_insensitive(agent, auth: str, status: int) -> None:  # noqa: ANN001
    url, surface = agent
    before = len(surface.calls)
    resp = httpx.post(url + "/api/v1/capture", json={"steps": 20.0}, timeout=30,
                      headers={"authorization": auth.encode("latin-1")})  # type: ignore[dict-item]
    assert resp.status_code == status, resp.text
    if status == 202:
        assert resp.json()["steps"] == 20 and surface.calls[-1] == (20, "torch") and len(surface.calls) == before + 1
    else:
        assert resp.json() == {"error": "a valid bearer token is required (see the agent's token file)"}
        assert resp.headers["www-authenticate"] == "Bearer" and len(surface.calls) == before


def test_unknown_routes_and_methods_are_json(agent) -> None:  # noqa: ANN001
    url, _ = agent
    assert httpx.get(url + "/api/v1/nothing", timeout=30).json() == {"error": "Not Found"}
    wrong = httpx.get(url + "/api/v1/capture", timeout=30)
    assert wrong.status_code == 405 and wrong.json() == {"error": "Method Not Allowed"}
    assert httpx.get(url + "/health", timeout=30).json()["status"] == "ok"


def test_bearer_matches() -> None:
    assert bearer_matches("Bearer abc", "abc") and bearer_matches("bearer abc", "abc")
    assert not bearer_matches("Bearer abcd", "abc") and not bearer_matches("Token abc", "abc")
