"""An ASGI app on a real uvicorn in a thread, on a free loopback port, and a raw-socket client for
what httpx will not send (slow headers, half bodies, malformed request lines). Imported as
`asgi_server` (tests/ is on the path)."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from testkit import free_port


@contextmanager
def running(app: Any, **options: Any) -> Iterator[tuple[str, int]]:
    """(base URL, port) of `app` served by uvicorn with `options` (e.g. HttpLimits.uvicorn_options())."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, **options)
    with running_config(config):
        yield f"http://127.0.0.1:{port}", port


@contextmanager
def running_config(config: uvicorn.Config) -> Iterator[uvicorn.Server]:
    """A uvicorn server of `config` in a daemon thread, started before this yields, stopped after."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(10)


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (monotonic s);
    raises TimeoutError if it is still open after `timeout`."""
    sock.settimeout(timeout)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data, time.monotonic()
        data += chunk


def split_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one raw HTTP/1.1 response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]))
    return int(lines[0].split()[1]), headers, body
