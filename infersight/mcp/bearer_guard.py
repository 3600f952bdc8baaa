"""BearerGuard: the HTTP transport's door. Every request must carry the agent's token as Bearer
credentials (infersight.http.bearer, the check the agent uses for captures: scheme in any case, constant-time compare);
without it the answer is 401 with a JSON error, and the MCP app never sees the request."""
from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from infersight.http.bearer import bearer_matches


class BearerGuard:
    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: the MCP app's session manager starts there
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if bearer_matches(authorization, self.token):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": "a valid bearer token is required (the agent's token file)"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
