"""The OTLP/gRPC receiver stops promptly with clients mid-call: a receiver process whose sink is stuck
(a handler that never returns), with calls in flight on both of its workers, one more queued
behind them and an idle open channel, exits within 5 s of SIGTERM with code 0, and every client
call ends (an error status, not a hang). Timed with this process's clock from the signal to the
child's exit. Before, the handler threads were joined at exit: the process stayed until the sink
returned."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span as PbSpan

from infersight.tracing.receiver import GRPC_SERVICE

REPO = Path(__file__).resolve().parents[2]
CHILD = """
import signal, sys, threading
from infersight.tracing.receiver import OtlpReceiver

stuck = threading.Event()

def sink(spans):
    sys.stdout.write("entered\\n")  # one write: print's text and newline can interleave across handler threads
    sys.stdout.flush()
    stuck.wait()  # never set: the handler never returns

rec = OtlpReceiver(sink, None, ("127.0.0.1", 0))
rec.start()

def stop(signum, frame):
    rec.stop()
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
print(rec.grpc_port, flush=True)
signal.pause()
"""


def body() -> bytes:
    span = PbSpan(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s", start_time_unix_nano=1, end_time_unix_nano=2)
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])]) \
        .SerializeToString()


def test_sigterm_with_calls_in_flight_exits_within_5_s() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        port = int(child.stdout.readline())
        busy = grpc.insecure_channel(f"127.0.0.1:{port}")
        idle = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(idle).result(timeout=10)  # connected, no call on it
        export = busy.unary_unary(f"/{GRPC_SERVICE}/Export", request_serializer=None, response_deserializer=None)
        calls = [export.future(body(), timeout=60) for _ in range(3)]  # two workers: two stuck, one queued
        assert [child.stdout.readline().strip() for _ in range(2)] == ["entered", "entered"]
        start = time.monotonic()
        child.send_signal(signal.SIGTERM)
        rc = child.wait(timeout=15)
        took = time.monotonic() - start
        codes = []
        for call in calls:
            try:
                call.result(timeout=5)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
        ended = time.monotonic() - start
        busy.close()
        idle.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert rc == 0
    assert took < 5.0, f"{took:.1f} s from SIGTERM to exit"
    assert ended < 5.0 and all(c in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) for c in codes), codes
