"""Shared pieces of the serve and tracing tests (imported, not a conftest): a tiny engine with probes
behind the HTTP app, reachable in-process (httpx ASGITransport) or on a real uvicorn port, and the
ring read back as the agent reads it."""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx

from asgi_server import running_config
from testkit import free_port, one_torch_thread, unique_ring  # noqa: F401  (re-exported)
from infersight.correlate.frames import EventFrames, update_labels
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import Engine, EngineConfig, ModelConfig
from infersight.serve.app import build_app
from infersight.serve.config import ServeConfig
from infersight.serve.engine_loop import EngineLoop
from infersight.serve.metrics import ServerCounters
from infersight.serve.probe_records import ProbeWriter
from infersight.serve.runner import uvicorn_config

MODEL = "tiny-test"
TINY = ModelConfig(MODEL, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, n_experts=4, top_k=2,
                   max_seq_len=256)
DRAFT = ModelConfig("tiny-draft-test", d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32, max_seq_len=256)


@dataclass
class Harness:
    """Engine + probes + engine thread + app. Close it (context manager) to stop the thread."""

    config: ServeConfig
    ring_capacity: int = 1 << 16
    max_pending: int = 64
    speculative: bool = False
    num_kv_blocks: int = 32
    cpu_offload_blocks: int = 8
    async_scheduling: bool = False
    ring: str = field(default_factory=lambda: unique_ring("serve"))

    def __post_init__(self) -> None:
        self.probe = ProbeObserver(ProbeConfig(ring_name=self.ring, ring_capacity=self.ring_capacity, nvtx=False))
        self.engine = Engine(EngineConfig(model=TINY, speculative_model=DRAFT if self.speculative else None,
                                          num_kv_blocks=self.num_kv_blocks, block_size=8,
                                          cpu_offload_blocks=self.cpu_offload_blocks,
                                          async_scheduling=self.async_scheduling),
                             self.probe)
        self.counters = ServerCounters()
        self.loop = EngineLoop(self.engine, ProbeWriter(self.probe, self.config.max_text_bytes), self.max_pending,
                               self.counters)
        self.app = build_app(self.loop, self.config, self.counters)
        self.consumer: RingConsumer | None = None
        self._labels: dict[int, str] = {0: "other"}
        self.loop.start()

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://serve.test", timeout=60)

    def read_frames(self) -> EventFrames:
        """Everything written to the ring since the last read, decoded as the agent decodes it."""
        if self.consumer is None:
            self.consumer = RingConsumer.attach(self.ring, record_registry())
        records = self.consumer.read()
        self._labels = update_labels(self._labels, records)
        return EventFrames.from_records(records, self._labels)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until every submitted request finished and its NETWORK record had time to be written."""
        deadline = time.monotonic() + timeout
        while self.loop.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)

    def close(self) -> None:
        self.loop.stop()
        if self.consumer is not None:
            self.consumer.close()
        self.probe.close()

    def __enter__(self) -> "Harness":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def real_server(harness: Harness) -> Iterator[str]:
    """The harness's app on a real uvicorn (h11, the server's limits) on a free loopback port."""
    config = harness.config
    served = ServeConfig(host="127.0.0.1", port=free_port(), max_header_bytes=config.max_header_bytes,
                         header_timeout_s=config.header_timeout_s)
    with running_config(uvicorn_config(harness.app, served)) as server:
        yield f"http://127.0.0.1:{server.config.port}"
