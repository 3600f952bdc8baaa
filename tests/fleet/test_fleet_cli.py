"""`infersight fleet`'s failures: one line on stderr and a non-zero exit, no traceback."""
from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from testkit import free_port

from infersight.cli import COMMANDS


def _fleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infersight", "fleet", *args], capture_output=True, text=True,
                          timeout=60)


def _one_line_error(run: subprocess.CompletedProcess, code: int, says: str) -> None:
    assert run.returncode == code, (run.returncode, run.stderr)
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in run.stderr, run.stderr


def test_fleet_is_a_command() -> None:
    assert "fleet" in COMMANDS


def test_unreachable_prometheus() -> None:
    port = free_port()  # nothing listens on it
    _one_line_error(_fleet("--prometheus-url", f"http://127.0.0.1:{port}"), 1, "is unreachable")


@pytest.mark.parametrize("args, says", [
    (["--prometheus-url", "127.0.0.1:9090"], "--prometheus-url must be an http(s) URL"),
    (["--prometheus-url", "http://127.0.0.1:9", "--since", "yesterday"], "--since must be a Prometheus duration"),
])
def test_bad_arguments(args: list[str], says: str) -> None:
    _one_line_error(_fleet(*args), 2, says)


class _NotPrometheus(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"<html>a web page</html>" if self.path.startswith("/api/v1/query?") else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web_page() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _NotPrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_a_url_that_is_not_prometheus(web_page: str) -> None:
    _one_line_error(_fleet("--prometheus-url", web_page), 1, "did not answer with Prometheus' JSON API")
