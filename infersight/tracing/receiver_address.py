"""Where the OTLP trace receiver listens (tracing.receiver): "HOST:PORT" parsed, the HTTP listener's
socket bound, and the one error for an address that cannot be used (the agent turns it into its
ConfigError). Each listener binds when the receiver is built, so a busy port fails at startup."""
from __future__ import annotations

import errno
import socket


class ReceiverConfigError(ValueError):
    """A receiver address that cannot be bound (the agent turns it into its ConfigError)."""


def parse_hostport(value: str) -> tuple[str, int]:
    """"HOST:PORT" (":PORT" means 127.0.0.1; IPv6 in brackets)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ReceiverConfigError(f"an OTLP receiver address must be HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def bind_http(host: str, port: int) -> socket.socket:
    """The OTLP/HTTP listener's socket, bound (ReceiverConfigError when it cannot be)."""
    try:  # (create_server sets SO_REUSEADDR on POSIX, never SO_REUSEPORT: a busy port fails here)
        return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        busy = " (in use)" if exc.errno == errno.EADDRINUSE else f": {exc.strerror}"
        raise ReceiverConfigError(f"cannot listen for OTLP/HTTP on {host}:{port}{busy}; "
                                  "pick another with --otlp-receiver HOST:PORT") from None
