"""The server's one config object, validated when built (ValueError -> exit code 2 in the CLI)."""
from __future__ import annotations

from dataclasses import dataclass


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

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        for name in ("max_body_bytes", "max_header_bytes", "max_pending", "default_max_tokens", "max_text_bytes",
                     "max_id_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.model_name:
            raise ValueError("model_name must not be empty")
