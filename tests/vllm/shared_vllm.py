"""The one tiny-Llama vLLM server that the live vLLM test modules share (a CPU vLLM takes 1-2 minutes
to start; CI starts it once per session, not once per module).

It is launched with the union of what those modules need:

    the stat-logger plugin (an entry point: always on) and our middleware   agreement, traces, recorder
    task labels code,json,chat                                              agreement, traces
    ngram speculation, 3 tokens; an 8 MiB KV cache (64 blocks: preempts)    agreement
    prefix caching                                                          agreement, capture
    the torch profiler into `profiles/`, the API server's own profiler off  capture, recorder
    max_model_len 2016, what that cache can hold (a 1,500-token stream)     recorder
    spans over OTLP/gRPC to `otlp_grpc_port`                                traces
    --enforce-eager                                                         (start-up time)

--enforce-eager skips vLLM's start-up "compilation", a minute or two of Dynamo graph capture on a
loaded 2-core host (without Inductor on this CPU build: vLLM's log says "Inductor compilation was
disabled"). It changes how the model's forward is dispatched, and nothing these modules observe is
inside the model: the API server's stat logger and middleware, the scheduler's numbers, the
profiler's step ranges, the ring. The module whose plugin runs inside the model (test_vllm_experts,
the expert counter) keeps vLLM's default.

Sharing it is safe because every module starts from a quiet server: no request is in flight
between modules (each module's traffic threads are joined before it ends), and each module

- reads vLLM's own counters as deltas over its own workload, never as totals;
- hands its agent a drained ring (`drain_ring`): the plugin's ring (infersight-vllm-<api pid>)
  keeps what no reader took, and a fresh agent would otherwise fold other modules' requests;
- empties `profiles/` before its captures (`fresh_profiles`), so every trace file there is its own;
- borrows the OTLP port (`borrow_otlp_port`): between modules a sink takes vLLM's spans at once,
  so that none waits in vLLM's exporter (retrying a closed port) for a later module's receiver.

The modules that need a different server keep their own, saying why (test_vllm_experts: the tiny
Mixtral; test_vllm_kv_live: KV events counted from sequence 0 on an empty cache).
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testkit import free_port

from infersight.probes.ring_consumer import RingConsumer
from infersight.vllm.launch import VllmServer, VllmServerConfig

MODEL = "tiny-llama"
MIDDLEWARE = "infersight.vllm.middleware.InfersightMiddleware"
TASKS = ("code", "json", "chat")
BLOCK_SIZE = 32
KV_CACHE_BYTES = 8 << 20
#: The longest request that cache can hold (vLLM refuses to start otherwise): 63 usable blocks of 32.
#: The recorder's stream needs ~1,520 tokens.
MAX_MODEL_LEN = 2016
NGRAM_TOKENS = 3
OTLP_GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


def shared_llama_config(model: Path, root: Path, otlp_grpc_port: int) -> VllmServerConfig:
    """The shared server's flags (the table in the module docstring)."""
    return VllmServerConfig(
        model=str(model), port=free_port(), served_model_name=MODEL, block_size=BLOCK_SIZE,
        kv_cache_memory_bytes=KV_CACHE_BYTES, max_model_len=MAX_MODEL_LEN, enable_prefix_caching=True,
        middleware=[MIDDLEWARE], ngram_speculative_tokens=NGRAM_TOKENS,
        profiler_dir=str(root / "profiles"), profiler_options={"ignore_frontend": True},
        otlp_traces_endpoint=f"127.0.0.1:{otlp_grpc_port}", otlp_protocol="grpc", extra_args=["--enforce-eager"],
        # A neutral working directory: a stale in-tree egg-info would hide our plugins (launch.py).
        env={"INFERSIGHT_TASK_LABELS": ",".join(TASKS), "OTEL_BSP_SCHEDULE_DELAY": "200"}, cwd=str(root))


class OtlpSink:
    """Accepts OTLP/gRPC trace exports and drops them, counting the calls (no SO_REUSEPORT: a module's
    receiver can bind the port only once the sink has let it go)."""

    def __init__(self, port: int) -> None:
        import grpc  # the test extra has it; imported here so that collecting tests/vllm stays light

        self.port, self.calls, self.last_call = port, 0, time.monotonic()

        def export(body: bytes, context: object) -> bytes:
            self.calls += 1
            self.last_call = time.monotonic()
            return b""  # an empty ExportTraceServiceResponse: everything accepted

        handler = grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None)
        self.server = grpc.server(ThreadPoolExecutor(max_workers=1, thread_name_prefix="otlp-sink"),
                                  options=[("grpc.so_reuseport", 0)])
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(OTLP_GRPC_SERVICE,
                                                                                   {"Export": handler}),))
        if not self.server.add_insecure_port(f"127.0.0.1:{port}"):
            raise RuntimeError(f"the OTLP sink cannot bind 127.0.0.1:{port}")
        self.server.start()

    def stop(self, quiet_s: float = 1.0, timeout_s: float = 30.0) -> None:
        """Once no export came for quiet_s (vLLM sends every 0.2 s here): the last spans are in."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() - self.last_call < quiet_s and time.monotonic() < deadline:
            time.sleep(0.1)
        self.server.stop(grace=1).wait(5)


@dataclass
class SharedVllm:
    server: VllmServer
    root: Path
    otlp_grpc_port: int
    sink: OtlpSink | None = None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def ring(self) -> str:
        """The stat-logger plugin's ring: named after the API-server process, which is the one started."""
        assert self.server.proc is not None
        return f"infersight-vllm-{self.server.proc.pid}"

    @property
    def profiles(self) -> Path:
        return self.root / "profiles"

    @property
    def log(self) -> Path:
        assert self.server.log_path is not None
        return self.server.log_path

    def drain_ring(self) -> int:
        """Take (and drop) whatever earlier modules left on the plugin's ring, so a new agent starts at
        this module's first record; returns how many slots were dropped. The ring keeps its sequence,
        so the agent then sees no gap."""
        consumer = RingConsumer.attach(self.ring)
        try:
            return sum(len(records) for records in consumer.read().values())
        finally:
            consumer.close()

    def fresh_profiles(self) -> Path:
        """The profiler directory, emptied of earlier modules' traces."""
        for entry in self.profiles.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        return self.profiles

    @contextmanager
    def borrow_otlp_port(self) -> Iterator[int]:
        """The port vLLM sends its spans to, free for a receiver of the caller's while inside; the sink
        takes it back after."""
        if self.sink is not None:
            self.sink.stop()
            self.sink = None
        try:
            yield self.otlp_grpc_port
        finally:
            self.sink = OtlpSink(self.otlp_grpc_port)

    def stop(self) -> None:
        self.server.stop()
        if self.sink is not None:
            self.sink.server.stop(grace=None)


def start_shared_llama(model: Path, root: Path) -> SharedVllm:
    """Launch without waiting (the caller waits: the start can overlap other work)."""
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    port = free_port()
    shared = SharedVllm(VllmServer(shared_llama_config(model, root, port), log_path=root / "vllm.log"), root, port,
                        OtlpSink(port))
    shared.server.start()
    return shared
