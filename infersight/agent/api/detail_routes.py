"""The JSON API's detail routes (added to agent.api.server's table; same limits and JSON errors):

GET /api/v1/requests/{id}                 one finished request explained (agent.api.request_explain); 404 if not kept
GET /api/v1/compare?a=START,END&b=START,END   two time windows compared (agent.api.window_compare)
GET /api/v1/kv/evictions?limit=N          who evicted whom (agent.eviction_log); 404 without the log
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from infersight.agent.eviction_log import EvictionLog
from infersight.agent.api.request_explain import explain_request
from infersight.agent.state import AgentState
from infersight.agent.api.window_compare import compare_windows, parse_window


def _bad(message: str) -> Response:
    return JSONResponse({"error": message}, status_code=400)


def detail_routes(state: AgentState, evictions: EvictionLog | None) -> list[Route]:
    async def one_request(request: Request) -> Response:
        raw = request.path_params["request_id"]
        try:
            request_id = int(raw)
        except ValueError:
            return _bad(f"the request id must be an integer, got {raw[:40]!r}")
        doc = explain_request(state, request_id)
        if doc is None:
            return JSONResponse({"error": f"request {request_id} is not among the finished requests kept "
                                          f"(--retention-mib), or has not finished"}, status_code=404)
        return JSONResponse(doc)

    async def compare(request: Request) -> Response:
        try:
            a = parse_window(request.query_params.get("a", ""), "a")
            b = parse_window(request.query_params.get("b", ""), "b")
        except ValueError as exc:
            return _bad(str(exc))
        return JSONResponse(compare_windows(state, a, b))

    async def kv_evictions(request: Request) -> Response:
        if evictions is None:
            return JSONResponse({"error": "this agent keeps no eviction log"}, status_code=404)
        raw = request.query_params.get("limit", "100")
        if not raw.isdigit() or not 0 <= int(raw) <= 10_000:
            return _bad(f"limit must be an integer in 0..10000, got {raw[:40]!r}")
        return JSONResponse(evictions.document(int(raw)))

    return [Route("/api/v1/requests/{request_id}", one_request), Route("/api/v1/compare", compare),
            Route("/api/v1/kv/evictions", kv_evictions)]
