"""The agent's HTTP surface (Starlette on uvicorn): /metrics and the JSON API.

GET /metrics                      Prometheus text, or OpenMetrics (with exemplars) when asked by Accept
GET /api/v1/summary               the numbers a dashboard or a program needs first
GET /api/v1/requests?slowest=N    the N slowest finished requests with their decomposition and cause
GET /api/v1/diagnosis             findings and speculation recommendations
POST /api/v1/capture              {"steps": N, "tool": "torch" | "cuda-profiler"}; bearer token required
GET /api/v1/captures              captures so far, with their kernel analysis once written
GET /health
"""
from __future__ import annotations

import hmac
import json
from dataclasses import asdict
from typing import Protocol, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from infersight.agent import report
from infersight.agent.capture import CaptureRecord, CaptureRefused
from infersight.agent.state import AgentState


class CaptureSurface(Protocol):
    """What the capture endpoints need of the agent process (agent.service.Agent provides it).
    A protocol, so the server does not import the service that builds it."""

    token: str

    def request_capture(self, steps: int, tool: str, reason: str = "api") -> CaptureRecord: ...

    @property
    def capture_records(self) -> Sequence[CaptureRecord]: ...


def build_app(state: AgentState, registry: CollectorRegistry, agent: CaptureSurface | None = None) -> Starlette:
    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), media_type=content_type)

    async def summary(request: Request) -> Response:
        return JSONResponse(report.summary(state))

    async def requests_(request: Request) -> Response:
        raw = request.query_params.get("slowest", "10")
        try:
            n = int(raw)
            if not 1 <= n <= 10_000:
                raise ValueError
        except ValueError:
            return JSONResponse({"error": f"slowest must be an integer in 1..10000, got {raw!r}"}, status_code=400)
        return JSONResponse({"requests": report.slowest(state, n)})

    async def diagnosis(request: Request) -> Response:
        return JSONResponse(report.diagnosis(state))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "rings": sorted(state.ring_stats)})

    async def capture(request: Request) -> Response:
        if agent is None:
            return JSONResponse({"error": "captures are not available here"}, status_code=404)
        if not hmac.compare_digest(request.headers.get("authorization", ""), f"Bearer {agent.token}"):
            return JSONResponse({"error": "a valid bearer token is required (see the agent's token file)"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        try:
            body = json.loads(await request.body() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            record = agent.request_capture(int(body.get("steps", 20)), str(body.get("tool", "torch")))
        except CaptureRefused as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error": f"bad capture request: {exc}"}, status_code=400)
        return JSONResponse(asdict(record), status_code=202)

    async def captures(request: Request) -> Response:
        records = agent.capture_records if agent is not None else []
        return JSONResponse({"captures": [asdict(r) for r in records]})

    return Starlette(routes=[
        Route("/metrics", metrics), Route("/api/v1/summary", summary), Route("/api/v1/requests", requests_),
        Route("/api/v1/diagnosis", diagnosis), Route("/health", health),
        Route("/api/v1/capture", capture, methods=["POST"]), Route("/api/v1/captures", captures)])
