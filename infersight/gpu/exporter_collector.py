"""Collector that scrapes a dcgm-exporter `/metrics` URL (urllib, bounded by a timeout).

Every failure raises `ScrapeError` (HTTP status, timeout, refused connection, text that is not
Prometheus exposition, a body without DCGM series): the sampler counts it and polls again at the
next tick, so a flapping exporter costs samples, never the sidecar. With a GpuSelection (a sidecar
reading its node's exporter) only the engine's GPUs' series become samples (gpu.selection).
"""
from __future__ import annotations

import http.client
import socket
import time
import urllib.error
import urllib.request
from typing import Callable, Protocol

from infersight.gpu.exporter_text import parse_exposition
from infersight.gpu.samples import GpuSample
from infersight.gpu.selection import GpuSelection

MAX_BODY_BYTES = 16 << 20  # a real exporter body is tens of KiB; refuse to buffer a runaway one


class ScrapeError(RuntimeError):
    """A scrape that produced no usable samples."""


class _Response(Protocol):
    status: int

    def read(self, amt: int = ...) -> bytes: ...

    def close(self) -> None: ...


Opener = Callable[[str, float], _Response]


def _urlopen(url: str, timeout_s: float) -> _Response:
    request = urllib.request.Request(url, headers={"Accept": "text/plain; version=0.0.4"})
    return urllib.request.urlopen(request, timeout=timeout_s)  # noqa: S310 (http(s) only, see config)


class DcgmExporterCollector:
    """Scrapes `url` once per poll. `opener` is injectable for tests (default: urllib). selection:
    which GPUs' series are kept (None: all)."""

    name = "dcgm-exporter"

    def __init__(self, url: str, timeout_s: float = 2.0, opener: Opener | None = None,
                 clock: Callable[[], int] = time.monotonic_ns, selection: GpuSelection | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.selection = selection
        self._open = opener or _urlopen
        self._clock = clock
        self._last_ok: str = "no scrape yet"

    def _fetch(self) -> str:
        try:
            response = self._open(self.url, self.timeout_s)
            try:
                body = response.read(MAX_BODY_BYTES + 1)
            finally:
                response.close()
        except urllib.error.HTTPError as e:
            raise ScrapeError(f"{self.url}: HTTP {e.code}") from e
        except (urllib.error.URLError, socket.timeout, http.client.HTTPException, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ScrapeError(f"{self.url}: {type(reason).__name__}: {reason}") from e
        if getattr(response, "status", 200) != 200:
            raise ScrapeError(f"{self.url}: HTTP {response.status}")
        if len(body) > MAX_BODY_BYTES:
            raise ScrapeError(f"{self.url}: body larger than {MAX_BODY_BYTES} bytes")
        return body.decode("utf-8", "replace")

    def poll(self) -> list[GpuSample]:
        text = self._fetch()
        try:
            parsed = parse_exposition(text, self._clock(), self.selection)
        except ValueError as e:
            raise ScrapeError(f"{self.url}: not Prometheus text ({e})") from e
        if parsed.dcgm_series == 0:
            raise ScrapeError(f"{self.url}: no DCGM series in the body (is this a dcgm-exporter?)")
        gpus = {key[:2] for key in parsed.gpus}
        self._last_ok = f"{len(gpus)} GPU(s), {len(parsed.samples)} samples at the last good scrape"
        if self.selection is not None:
            self._last_ok += (f"; kept by {self.selection.describe()}, {len(parsed.not_selected)} other GPU(s) "
                              "of the node left out")
        return parsed.samples

    def close(self) -> None:
        """Nothing to release: every scrape opens and closes its own connection."""

    def status_line(self) -> str:
        return f"GPU telemetry: dcgm-exporter {self.url} ({self._last_ok})"
