"""A broken scrape target: a real HTTP server on 127.0.0.1 that answers 500, then garbage, then
hangs past the timeout, then a good body. Each failure is a counted error, nothing crashes, and
the next good scrape delivers samples, both polled by hand and on the sampler's own thread."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infersight.gpu.exporter_collector import DcgmExporterCollector, ScrapeError
from infersight.gpu.sampler import GpuSampler

GOOD = ('# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge\n'
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-a",Hostname="h"} 0.75\n'
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",Hostname="h"} 3\n')
TIMEOUT_S = 0.3


class Target:
    """Serves the next mode from `script` for each request; the last mode repeats."""

    def __init__(self) -> None:
        self.script: list[str] = ["good"]
        self.requests = 0
        self.release = threading.Event()  # lets a hung handler finish when the test ends
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                mode = target.script[min(target.requests, len(target.script) - 1)]
                target.requests += 1
                if mode == "hang":
                    target.release.wait(TIMEOUT_S * 4)
                body, status = {"500": (b"internal error", 500), "garbage": (b"\x00<html>not metrics{{{", 200),
                                "other": (b"process_cpu_seconds_total 1.5\n", 200),
                                "hang": (GOOD.encode(), 200), "good": (GOOD.encode(), 200)}[mode]
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the hang case)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target()
    yield t
    t.close()


def test_each_failure_is_counted_and_the_next_good_scrape_works(target: Target) -> None:
    target.script = ["500", "garbage", "hang", "other", "good"]
    sampler = GpuSampler(DcgmExporterCollector(target.url, timeout_s=TIMEOUT_S), interval_s=1.0)
    messages = []
    for _ in range(4):
        t0 = time.monotonic()
        assert sampler.poll_once() == 0
        assert time.monotonic() - t0 < TIMEOUT_S * 3  # the hang is cut at the timeout
        messages.append(sampler.status_line())
    assert sampler.error_counts() == {"dcgm-exporter": 4}
    assert "HTTP 500" in messages[0] and "not Prometheus text" in messages[1]
    assert "timed out" in messages[2].lower() and "no DCGM series" in messages[3]
    assert sampler.poll_once() == 2
    latest = {s.field: s.value for s in sampler.latest()}
    assert latest == {"tensor_active_ratio": 0.75, "memory_used_bytes": 3 * 1024 * 1024}
    assert sampler.error_counts() == {"dcgm-exporter": 4}
    assert "1 GPU(s)" in sampler.collector.status_line()


def test_refused_connection_is_a_scrape_error() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = DcgmExporterCollector(f"http://127.0.0.1:{port}/metrics", timeout_s=TIMEOUT_S)
    with pytest.raises(ScrapeError):
        c.poll()


def test_sampler_thread_survives_a_flapping_target(target: Target) -> None:
    target.script = ["500", "hang", "garbage", "good"]
    sampler = GpuSampler(DcgmExporterCollector(target.url, timeout_s=TIMEOUT_S), interval_s=0.1).start()
    try:
        deadline = time.monotonic() + 5.0
        while not sampler.latest() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        sampler.stop()
    assert sampler.error_counts()["dcgm-exporter"] == 3
    assert {s.field for s in sampler.latest()} == {"tensor_active_ratio", "memory_used_bytes"}
    assert not sampler._thread.is_alive()  # type: ignore[union-attr]
