"""A slow or dead OTLP endpoint never holds the agent: a real `infersight agent` process, under load,
exporting to a TCP server that accepts and never replies (over OTLP/HTTP and over gRPC, whose HTTP/2
connection then never comes up) or to a closed port, exits within 5 s of
SIGTERM with code 0 and reports what it could not send; while the outage lasts its RSS stays within its
queue's byte limit above the same load's against a healthy endpoint."""
from __future__ import annotations

import ast
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from testkit import free_port

from infersight.bench.agent import synthetic_workload
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver

QUEUE_BYTES = 1 << 20
BUFFER_BYTES = 4 << 20


@contextmanager
def black_hole() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts every connection, reads what comes, and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.setblocking(False)
            held.append(conn)
            for c in held:  # drain, so the sender's writes never block: it waits for an answer only
                try:
                    while c.recv(1 << 16):
                        pass
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        for c in held:
            c.close()
        server.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def summary(port: int) -> dict:
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/summary", timeout=5).read())


def start_agent(ring: str, port: int, endpoint: str | None, tmp: Path, protocol: str = "http/protobuf"
                ) -> tuple[subprocess.Popen, Path]:
    """An agent exporting to endpoint with the module's limits (None: no OTLP export at all)."""
    log = tmp / "agent.log"
    otlp = [] if endpoint is None else [
        "--otlp-endpoint", endpoint, "--otlp-protocol", protocol, "--otlp-queue-bytes", str(QUEUE_BYTES),
        "--trace-buffer-bytes", str(BUFFER_BYTES), "--otlp-export-timeout", "2"]  # the default shutdown timeout: 3 s
    proc = subprocess.Popen(
        [sys.executable, "-m", "infersight", "agent", "--ring", ring, "--listen", f"127.0.0.1:{port}",
         "--poll-interval", "0.05", "--gpu-source", "none", *otlp],
        stdout=subprocess.DEVNULL, stderr=log.open("w"),
        env={**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "50",
             "XDG_RUNTIME_DIR": str(tmp)})
    deadline = time.monotonic() + 60
    while True:
        try:
            summary(port)
            return proc, log
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("agent did not start: " + log.read_text()[-2000:]) from None
            time.sleep(0.1)


def stop_and_time(proc: subprocess.Popen) -> tuple[int, float]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("the agent was still running 15 s after SIGTERM") from None
    return rc, time.monotonic() - t0


@pytest.mark.parametrize("endpoint_kind", ["black_hole", "closed", "grpc_black_hole"])
def test_sigterm_with_a_dead_endpoint_exits_within_5_s_and_counts_the_unsent(endpoint_kind: str,
                                                                              tmp_path: Path) -> None:
    ring = f"infersight-test-shutdown-{os.getpid()}-{endpoint_kind}"
    port = free_port()
    with black_hole() as hole:
        target = hole if endpoint_kind.endswith("black_hole") else free_port()  # closed: nothing listens there
        protocol = "grpc" if endpoint_kind.startswith("grpc") else "http/protobuf"  # gRPC: HTTP/2 never set up
        proc, log = start_agent(ring, port, f"http://127.0.0.1:{target}", tmp_path, protocol)
        probe = ProbeObserver(ProbeConfig(ring_name=ring, nvtx=False))
        try:
            synthetic_workload(probe, 256, 8, pause_s=0.01)
            deadline = time.monotonic() + 30  # until the agent has built 256 spans (queued, or dropped: full)
            while time.monotonic() < deadline:
                built = summary(port)["sources"].get("otlp_export", {"spans_queued": 0, "dropped": {}})
                if built["spans_queued"] + built["dropped"].get("queue_bytes", 0) >= 256:
                    break
                time.sleep(0.1)
            stats = summary(port)["sources"]["otlp_export"]
            assert stats["spans_exported"] == 0  # nobody answered
            rc, took = stop_and_time(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
            probe.close()
    text = log.read_text()
    assert rc == 0, text[-2000:]
    assert took < 5.0, f"{took:.1f} s to exit\n{text[-2000:]}"
    assert "Traceback" not in text
    line = next(ln for ln in text.splitlines() if "OTLP export at exit" in ln)
    fields = re.search(r"(\d+) spans queued, (\d+) exported, (\d+) unsent at shutdown, dropped (\{.*\})", line)
    assert fields is not None, line
    queued, exported, unsent = (int(fields.group(i)) for i in (1, 2, 3))
    dropped = ast.literal_eval(fields.group(4))
    # Every queued span is accounted for, and none was exported: nobody answered.
    assert exported == 0 and queued == dropped["export_failed"] + dropped["shutdown"] and dropped["shutdown"] == unsent
    assert queued >= stats["spans_queued"] > 100
    if endpoint_kind == "black_hole":  # (over gRPC the exports fail as UNAVAILABLE instead: counted export_failed)
        # 2 s per export of 50 spans and 3 s to shut down: at most two batches go, the rest stays unsent.
        assert unsent >= queued - stats["dropped"]["export_failed"] - 100 > 0


#: The outage load's pause between waves of 32 requests: ~1,000 requests/s here, which the agent reads whole
#: (97% of the ring's slots) while it exports, as when it cannot. At 5 ms (~2,700/s) the exporting agent fell
#: behind (51-58% read) and the black-holed one did not (75-80%): the outage run held more requests' state
#: than the run it was compared with, 13-26 MB more RSS, and one suite run crossed the ceiling by 3.6 MB.
WAVE_PAUSE_S = 0.025


def _load(endpoint: str | None, outage_s: float, tmp: Path) -> tuple[list[tuple[float, float]], dict, dict, int]:
    """The outage load (waves of 64 requests, 16 steps each) for outage_s against an agent exporting to
    endpoint (None: no export): its RSS samples (s, MB), its summary at the end, the ring's counts, and
    how it exited."""
    ring = f"infersight-test-outage-{os.getpid()}-{endpoint is None}"
    port = free_port()
    tmp.mkdir(exist_ok=True)
    proc, log = start_agent(ring, port, endpoint, tmp)
    probe = ProbeObserver(ProbeConfig(ring_name=ring, nvtx=False))
    samples: list[tuple[float, float]] = []
    try:
        start = time.monotonic()
        samples.append((0.0, rss_mb(proc.pid)))
        first, step = 0, 0
        while (now := time.monotonic() - start) < outage_s:
            step = synthetic_workload(probe, 64, 16, pause_s=WAVE_PAUSE_S, first_id=first, first_step=step)
            first += 64
            samples.append((now, rss_mb(proc.pid)))
        end = summary(port)
        ring_counts = probe.ring.stats()
        rc, took = stop_and_time(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        probe.close()
    assert rc == 0 and took < 5.0, log.read_text()[-2000:]
    return samples, end, ring_counts, first


def test_rss_stays_bounded_through_an_outage_under_load(tmp_path: Path) -> None:
    """Load for INFERSIGHT_OUTAGE_S (20 s by default; 60 s for a long run) against a healthy OTLP endpoint,
    then the same load against a black hole: there the export queue fills to its byte limit and then drops
    (counted); RSS stays within what the queue may hold (its limit, twice: estimates err) above the healthy
    run's peak."""
    from infersight.bench.serving.otlp_sink import OtlpSink

    outage_s = float(os.environ.get("INFERSIGHT_OUTAGE_S", "20"))
    sink = OtlpSink()
    try:
        healthy, healthy_end, healthy_ring, _ = _load(sink.url, outage_s, tmp_path / "healthy")
    finally:
        sink.close()
    assert healthy_end["sources"]["otlp_export"]["spans_exported"] > 0 and sink.exports > 0
    with black_hole() as hole:
        samples, end, ring_counts, first = _load(f"http://127.0.0.1:{hole}", outage_s, tmp_path / "outage")
    stats = end["sources"]["otlp_export"]
    assert stats["spans_exported"] == 0 and stats["dropped"]["queue_bytes"] + stats["dropped"]["queue_full"] > 0
    assert stats["queue_bytes"] <= QUEUE_BYTES

    # The ceiling: the healthy run's peak above its base (the agent's state, the buffers and the exporter at
    # this load; its RSS swings ~30 MB with each encoded batch), plus the queue full (its estimate errs high,
    # so twice it), plus one swing: the largest rise between two of the healthy run's samples, at least 16 MB
    # (two runs' polls differ in size; with 16 alone, one suite run's outage peak landed 1.9 MB over). A
    # runaway does not pass it: with the queue's limits lifted (a mutant), the spans held (~80,000 in 20 s) took
    # the outage run to 544 MB against a ceiling near 320. Both runs read about the same share of the ring
    # (WAVE_PAUSE_S), so they hold the same requests' state: printed, since the comparison rests on it.
    base, peak, healthy_peak = samples[0][1], max(r for _, r in samples), max(r for _, r in healthy)
    swing = max([16.0, *(b - a for (_, a), (_, b) in zip(healthy, healthy[1:]))])
    ceiling = base + healthy_peak - healthy[0][1] + 2 * QUEUE_BYTES / 2**20 + swing
    kept_up = 1 - ring_counts["dropped"] / ring_counts["produced"]
    healthy_kept_up = 1 - healthy_ring["dropped"] / healthy_ring["produced"]
    print(f"outage {outage_s:.0f} s: base {base:.0f} MB (healthy run {healthy[0][1]:.0f} MB), peak {peak:.0f} MB "
          f"(healthy {healthy_peak:.0f} MB, largest rise {swing:.0f} MB), ceiling {ceiling:.0f} MB; requests {first}, ring slots read "
          f"{kept_up:.3f} (healthy run {healthy_kept_up:.3f}), dropped {stats['dropped']}")
    assert peak <= ceiling
