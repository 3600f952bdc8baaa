"""McpConfig: what `infersight mcp` needs, validated when built."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

TRANSPORTS = ("stdio", "streamable-http")


@dataclass(frozen=True)
class McpConfig:
    """agent_url: the agent's base URL (http://HOST:PORT). token_file: the agent's capture token (None:
    the agent's default file for its port). timeout_s: the bound on every call to the agent, so a
    slow or stuck agent makes a tool error, never a hung client. host/port: the HTTP transport's
    listener (loopback by default)."""

    agent_url: str = "http://127.0.0.1:9464"
    transport: str = "stdio"
    host: str = "127.0.0.1"
    port: int = 9465
    token_file: Path | None = None
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        parts = urlsplit(self.agent_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--agent must be an http(s)://HOST:PORT URL, got {self.agent_url!r}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"--transport must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"the listen port must be in 1..65535, got {self.port}")
        if not 0.1 <= self.timeout_s <= 300:
            raise ValueError(f"--timeout must be in 0.1..300 seconds, got {self.timeout_s:g}")

    @property
    def agent_port(self) -> int:
        parts = urlsplit(self.agent_url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    def resolved_token_file(self) -> Path:
        from infersight.agent.api.token_file import default_token_file

        return self.token_file if self.token_file is not None else default_token_file(self.agent_port)
