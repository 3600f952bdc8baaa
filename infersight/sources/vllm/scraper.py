"""Scraping vLLM's /metrics on the agent's side (`--vllm-url`): HTTP with timeouts, counted failures,
the background thread, and the latest normalised view (vllm_metrics.parse_vllm_text).

A failed scrape (unreachable, timeout, HTTP status, unparsable text, no vllm:* families) is
counted by reason and logged in one line when the failure starts or changes; the last good view
is served until it is older than three intervals, then dropped, so a dead server shows as gaps.
"""
from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from infersight.exporters import catalogue as C
from infersight.exporters.scraped_view import ScrapedView
from infersight.sources.vllm.metrics import parse_vllm_text

log = logging.getLogger("infersight.agent")
SOURCE = "vllm"
MAX_BODY_BYTES = 16 << 20  # vLLM's body is ~50 KiB; never buffer a runaway one


class ScrapeFailed(RuntimeError):
    """reason: one of the catalogue's SOURCE_SCRAPE_ERRORS reasons."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def fetch_text(url: str, timeout_s: float) -> str:
    """GET url (bounded by timeout_s per socket operation and MAX_BODY_BYTES); ScrapeFailed otherwise."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain; version=0.0.4"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 (the operator's URL)
            body = resp.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise ScrapeFailed("http_status", f"HTTP {exc.code}") from None
    except (socket.timeout, TimeoutError):
        raise ScrapeFailed("timeout", f"no answer within {timeout_s:g} s") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise ScrapeFailed("timeout", f"no answer within {timeout_s:g} s") from None
        raise ScrapeFailed("unreachable", f"{type(reason).__name__}: {reason}") from None
    except (http.client.HTTPException, OSError) as exc:
        raise ScrapeFailed("unreachable", f"{type(exc).__name__}: {exc}") from None
    if len(body) > MAX_BODY_BYTES:
        raise ScrapeFailed("unparsable", f"body larger than {MAX_BODY_BYTES} bytes")
    return body.decode("utf-8", "replace")


class VllmMetricsScraper:
    """Scrapes `base_url`/metrics every interval_s on its own thread and keeps the latest view.
    Nothing here raises into the agent: every failure is counted (counts(), the collector)."""

    def __init__(self, base_url: str, interval_s: float = 2.0, timeout_s: float = 2.0) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._view: ScrapedView | None = None
        self._view_at = 0.0
        self._scrapes = 0
        self._errors: dict[str, int] = {}
        self._failing: str | None = None  # the reason of the current run of failures (logged once)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape_once(self) -> ScrapedView | None:
        """One scrape now: the new view, or None (counted and, when a failure starts, logged)."""
        try:
            text = fetch_text(self.url, self.timeout_s)
            try:
                view = parse_vllm_text(text)
            except ValueError as exc:
                raise ScrapeFailed("no_engine_metrics" if "no vllm:*" in str(exc) else "unparsable",
                                   str(exc)) from None
        except ScrapeFailed as exc:
            with self._lock:
                self._scrapes += 1
                self._errors[exc.reason] = self._errors.get(exc.reason, 0) + 1
                first = self._failing != exc.reason
                self._failing = exc.reason
            if first:
                log.warning("vLLM metrics %s: %s (%s); counted, retrying every %.1f s", self.url, exc.reason, exc,
                            self.interval_s)
            return None
        with self._lock:
            self._scrapes += 1
            self._view, self._view_at = view, time.monotonic()
            recovered, self._failing = self._failing, None
        if recovered:
            log.info("vLLM metrics %s: scraping again", self.url)
        return view

    def latest(self) -> ScrapedView | None:
        """The last good view, unless it is older than three intervals (a dead server shows as gaps)."""
        with self._lock:
            fresh = time.monotonic() - self._view_at <= 3 * self.interval_s + self.timeout_s
            return self._view if fresh else None

    def step_count(self) -> float | None:
        """vLLM's engine-step counter from a fresh scrape (None when it failed or has none)."""
        view = self.scrape_once()
        return view.steps if view is not None else None

    def counts(self) -> tuple[int, dict[str, int]]:
        """(scrapes attempted, failed scrapes by reason)."""
        with self._lock:
            return self._scrapes, dict(self._errors)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.scrape_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> "VllmMetricsScraper":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="infersight-vllm-metrics")
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None

    def collector(self) -> Collector:
        return _ScrapeCounts(self)


class _ScrapeCounts(Collector):
    """SOURCE_SCRAPES and SOURCE_SCRAPE_ERRORS of one scraper."""

    def __init__(self, scraper: VllmMetricsScraper) -> None:
        self.scraper = scraper

    def collect(self) -> Iterator[Metric]:
        scrapes, errors = self.scraper.counts()
        fam = CounterMetricFamily(C.SOURCE_SCRAPES.name, C.SOURCE_SCRAPES.help, labels=list(C.SOURCE_SCRAPES.labels))
        fam.add_metric([SOURCE], scrapes)
        yield fam
        fam = CounterMetricFamily(C.SOURCE_SCRAPE_ERRORS.name, C.SOURCE_SCRAPE_ERRORS.help,
                                  labels=list(C.SOURCE_SCRAPE_ERRORS.labels))
        for reason, n in sorted(errors.items()):
            fam.add_metric([SOURCE, reason], n)
        yield fam
