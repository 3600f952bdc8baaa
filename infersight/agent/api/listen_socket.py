"""The agent's own HTTP listener socket (/metrics, /api/v1/...), bound and listening before any other
work, so that a busy or unusable address is a usage error (ConfigError) at startup."""
from __future__ import annotations

import errno
import socket

from infersight.config_error import ConfigError


class PortInUseError(ConfigError):
    """The agent's --listen address is already in use."""


def bind_listener(host: str, port: int) -> socket.socket:
    """A socket bound to host:port and listening (PortInUseError / ConfigError when it cannot be)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(f"{host}:{port} is already in use; pick another with --listen HOST:PORT") from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    # Listening now, not when uvicorn's thread gets to it: a client that connects as soon as the port
    # is known (or logged as served) waits in the backlog instead of being refused.
    sock.listen(2048)
    return sock
