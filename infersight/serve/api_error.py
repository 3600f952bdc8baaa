"""OpenAI-style errors: {"error": {message, type, param, code}}, for the handlers and the HTTP limits."""
from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An HTTP error with an OpenAI-style body; `reason` labels the rejection counter."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, reason: str = "invalid_request") -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code, self.reason = status, message, type, param, code, reason

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def openai_error_body(status: int, message: str, reason: str) -> dict[str, Any]:
    """The body of an answer the HTTP limits give (an infersight.http.limits.ErrorRender)."""
    kind = "server_error" if status >= 500 else "rate_limit_error" if status == 429 else "invalid_request_error"
    return APIError(status, message, type=kind, code=reason).body()
