"""OtlpSink: a local OTLP/HTTP endpoint that accepts every export and counts it (bench serving's `full`
arm, the soaks, tests that look at what an agent exports)."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OtlpSink:
    """A local OTLP/HTTP endpoint for span export (the `full` arm's; the soak's): answers every export
    200 and counts exports and bytes; with keep_bodies, also keeps each export's (path, body)."""

    def __init__(self, keep_bodies: bool = False) -> None:
        sink = self
        self.exports = self.bytes = 0
        self.bodies: list[tuple[str, bytes]] | None = [] if keep_bodies else None

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.exports, sink.bytes = sink.exports + 1, sink.bytes + len(body)
                if sink.bodies is not None:
                    sink.bodies.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
