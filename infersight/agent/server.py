"""The agent's HTTP surface (Starlette on uvicorn): /metrics and the JSON API.

GET /metrics                      Prometheus text, or OpenMetrics (with exemplars) when asked by Accept
GET /api/v1/summary               the numbers a dashboard or a program needs first
GET /api/v1/requests?slowest=N    the N slowest finished requests with their decomposition and cause
GET /api/v1/diagnosis             findings and speculation recommendations
GET /health
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from infersight.agent import report
from infersight.agent.state import AgentState


def build_app(state: AgentState, registry: CollectorRegistry) -> Starlette:
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

    return Starlette(routes=[
        Route("/metrics", metrics), Route("/api/v1/summary", summary), Route("/api/v1/requests", requests_),
        Route("/api/v1/diagnosis", diagnosis), Route("/health", health)])
