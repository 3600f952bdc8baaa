"""The agent's HTTP surface (Starlette on uvicorn): /metrics and the JSON API.

GET /metrics                      Prometheus text, or OpenMetrics (with exemplars) when asked by Accept
GET /api/v1/summary               the numbers a dashboard or a program needs first
GET /api/v1/requests?slowest=N    the N slowest finished requests with their decomposition and cause
GET /api/v1/diagnosis             findings and speculation recommendations
POST /api/v1/capture              {"steps": N, "tool": "torch" | "cuda-profiler"}; bearer token required
GET /api/v1/captures              captures so far, with their kernel analysis once written
GET /api/v1/requests/{id}, /api/v1/compare, /api/v1/kv/evictions   one request, two windows, who evicted whom
                                  (agent.api.detail_routes)
GET /api/v1/decisions             the closed loop's decisions and what is in force (agent.autoapply.routes)
GET /health

Every route sits behind infersight.http.limits (64 KiB bodies, JSON nesting, header and body
deadlines, --max-connections) and every error, 404 and 405 included, is a JSON {"error": "..."}. The capture token is
checked as RFC 7235 says: the scheme `Bearer` in any case, the credentials compared in constant time.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from typing import Any, Callable, Protocol, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from infersight.agent.api import report
from infersight.agent.capture.controller import CaptureRecord, CaptureRefused
from infersight.agent.autoapply.routes import decision_routes, loop_off_document
from infersight.agent.api.detail_routes import detail_routes
from infersight.agent.eviction_log import EvictionLog
from infersight.agent.state import AgentState
from infersight.http.bearer import bearer_matches  # noqa: F401  (re-exported: the agent's token check)
from infersight.http.connections import ConnectionGate
from infersight.http.limits import HttpLimits, LimitedApp, routes_app, simple_error_body

#: The agent's bodies are capture requests of a few bytes.
AGENT_LIMITS = HttpLimits(max_body_bytes=64 << 10, max_json_depth=16)


def listener_options(max_connections: int, registry: CollectorRegistry) -> dict[str, Any]:
    """uvicorn.Config options of the agent's API listener: AGENT_LIMITS, at most max_connections held
    at once, the refused ones counted on `registry` (server="agent")."""
    gate = ConnectionGate(max_connections, "agent")
    registry.register(gate.collector())
    return replace(AGENT_LIMITS, max_connections=max_connections).uvicorn_options(gate=gate)


class CaptureSurface(Protocol):
    """What the capture endpoints need of the agent process (agent.service.Agent provides it).
    A protocol, so the server does not import the service that builds it."""

    token: str

    def request_capture(self, steps: int, tool: str, reason: str = "api",
                        decode: str | None = None) -> CaptureRecord: ...

    @property
    def capture_records(self) -> Sequence[CaptureRecord]: ...


def _steps(value: Any) -> int:
    """An integer step count (20.0 counts; 1e999, true and "20" do not); its range is the capture's."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"steps must be an integer, got {json.dumps(value)[:40]}")
    return value


def build_app(state: AgentState, registry: CollectorRegistry, agent: CaptureSurface | None = None,
              limits: HttpLimits = AGENT_LIMITS, evictions: EvictionLog | None = None,
              decisions: Callable[[int], dict[str, Any]] | None = None) -> ASGIApp:
    """decisions(limit): GET /api/v1/decisions's document (agent.autoapply.routes; None: the loop is off)."""
    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), media_type=content_type)

    async def summary(request: Request) -> Response:
        doc = report.summary(state)
        if decisions is not None and (loop := decisions(20))["auto_apply"] == "on":
            doc["auto_apply"] = loop  # the closed loop's last decisions: in summary.json and the HTML report
        return JSONResponse(doc)

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
        if not bearer_matches(request.headers.get("authorization", ""), agent.token):
            return JSONResponse({"error": "a valid bearer token is required (see the agent's token file)"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        try:
            body = json.loads(await request.body() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            tool = body.get("tool", "torch")
            if not isinstance(tool, str):
                raise ValueError(f"tool must be a string, got {json.dumps(tool)[:40]}")
            decode = body.get("decode")  # "eager" (per-layer ranges) or "graphs" (replays); None: the tool's own
            if decode is not None and decode not in ("eager", "graphs"):
                raise ValueError(f"decode must be 'eager' or 'graphs', got {json.dumps(decode)[:40]}")
            record = agent.request_capture(_steps(body.get("steps", 20)), tool, decode=decode)
        except CaptureRefused as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: only if the limits were bypassed
            return JSONResponse({"error": f"bad capture request: {str(exc)[:200]}"}, status_code=400)
        return JSONResponse(asdict(record), status_code=202)

    async def captures(request: Request) -> Response:
        records = agent.capture_records if agent is not None else []
        return JSONResponse({"captures": [asdict(r) for r in records]})

    app = routes_app([
        Route("/metrics", metrics), Route("/api/v1/summary", summary), Route("/api/v1/requests", requests_),
        Route("/api/v1/diagnosis", diagnosis), Route("/health", health),
        Route("/api/v1/capture", capture, methods=["POST"]), Route("/api/v1/captures", captures),
        *detail_routes(state, evictions), *decision_routes(decisions or loop_off_document)])
    return LimitedApp(app, limits, simple_error_body)
