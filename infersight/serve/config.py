"""The server's one config object, validated when built (ValueError -> exit code 2 in the CLI)."""
from __future__ import annotations

from dataclasses import dataclass

from infersight.http.limits import HttpLimits


@dataclass
class ServeConfig:
    """Safe defaults: loopback only, bounded bodies, headers and queue. model_name: the name clients
    send as `model` and that spans carry. export_content: pass prompt/completion text to the
    sidecar (otherwise it never leaves the server); max_text_bytes bounds each exported text."""

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "tiny-moe"
    max_body_bytes: int = 1 << 20
    max_header_bytes: int = 16 << 10
    max_pending: int = 256
    retry_after_s: int = 1
    default_max_tokens: int = 16
    export_content: bool = False
    max_text_bytes: int = 32 << 10
    max_id_bytes: int = 256  # session and user ids, task labels
    max_json_depth: int = 64  # nesting of arrays/objects in a body (400 beyond, before parsing)
    header_timeout_s: float = 10.0  # from a request's first byte to its last header byte (408 beyond)
    body_timeout_s: float = 30.0  # to read the whole body once the headers are in (408 beyond)
    max_connections: int = 512  # held at once (idle keep-alive ones too); one more: 503, closed, counted
    engine_in_process: bool = False  # the engine thread beside the HTTP server, sharing one interpreter

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        for name in ("max_body_bytes", "max_header_bytes", "max_pending", "default_max_tokens", "max_text_bytes",
                     "max_id_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        self.limits  # noqa: B018 -- validates the HTTP limits now (ValueError)

    @property
    def limits(self) -> HttpLimits:
        """The HTTP limits this server applies (infersight.http.limits)."""
        return HttpLimits(max_body_bytes=self.max_body_bytes, max_header_bytes=self.max_header_bytes,
                          max_json_depth=self.max_json_depth, header_timeout_s=self.header_timeout_s,
                          body_timeout_s=self.body_timeout_s, max_connections=self.max_connections)
