"""A bound on the connections one HTTP server holds at once, and the count of those it refused.

uvicorn accepts every connection; each costs a file descriptor, buffers and a protocol object until
the client closes it or a timer does. Thousands of idle or slow clients therefore exhaust the
process's descriptors (often 1,024) and every later client fails, the well-behaved ones included.
The gate admits at most max_connections; one over it is refused at once: its request line and
headers are awaited (a second at most, so the client reads an answer rather than a reset) and
answered 503 with a JSON body, `Retry-After` and `connection: close`, then closed. Refusals are
counted for the server's /metrics (HTTP_CONNECTIONS_REFUSED; a server that counts refusals its own
way passes on_refuse: the OTLP receiver counts them as bodies refused, reason too_many_connections).

uvicorn's own `limit_concurrency` is not used: it answers in plain text, counts nothing, and still
holds every connection until a request arrives on it.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infersight.exporters import catalogue as C

#: How long a refused connection may take to send its request head before it is answered anyway.
REFUSED_WAIT_S = 1.0


class ConnectionGate:
    """At most max_connections open at once on one server (named by `server` on /metrics).

    admit() and release() are called by the server's protocol on its event loop; the counts are
    read from the scrape thread, hence the lock."""

    def __init__(self, max_connections: int, server: str = "http",
                 on_refuse: Callable[[], None] | None = None) -> None:  # noqa: D107
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.max_connections, self.server, self.on_refuse = max_connections, server, on_refuse
        self.open = 0
        self.refused = 0
        self._lock = threading.Lock()

    def admit(self) -> bool:
        """Take a place for a new connection, or count it refused (False) when none is left."""
        with self._lock:
            admitted = self.open < self.max_connections
            if admitted:
                self.open += 1
            else:
                self.refused += 1
        if not admitted and self.on_refuse is not None:
            self.on_refuse()
        return admitted

    def release(self) -> None:
        """An admitted connection closed."""
        with self._lock:
            self.open -= 1

    def refusal_message(self) -> str:
        return f"the server holds {self.max_connections} connections (--max-connections); retry later"

    def collector(self) -> Collector:
        """The refused count and the open connections, for the server's registry."""
        return _GateCollector([self])


class RefusedHead:
    """Waits for a refused connection's request head (up to its blank line, or max_bytes), so the
    503 answers a request the client has finished sending."""

    def __init__(self, max_bytes: int) -> None:  # noqa: D107
        self.max_bytes = max_bytes
        self.seen = 0
        self._tail = b""

    def complete(self, data: bytes) -> bool:
        """Whether, with `data`, the head is in (or is more than it may be)."""
        self.seen += len(data)
        window = self._tail + data
        self._tail = window[-3:]
        return b"\r\n\r\n" in window or self.seen > self.max_bytes


class _GateCollector(Collector):
    def __init__(self, gates: list[ConnectionGate]) -> None:
        self.gates = gates

    def collect(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(C.HTTP_CONNECTIONS_REFUSED.name, C.HTTP_CONNECTIONS_REFUSED.help,
                                      labels=list(C.HTTP_CONNECTIONS_REFUSED.labels))
        open_ = GaugeMetricFamily(C.HTTP_CONNECTIONS_OPEN.name, C.HTTP_CONNECTIONS_OPEN.help,
                                  labels=list(C.HTTP_CONNECTIONS_OPEN.labels))
        for gate in self.gates:
            with gate._lock:
                n_refused, n_open = gate.refused, gate.open
            refused.add_metric([gate.server], n_refused)
            open_.add_metric([gate.server], n_open)
        yield refused
        yield open_
