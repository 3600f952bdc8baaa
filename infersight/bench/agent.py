"""`infersight bench agent`: the sidecar's ingest rate, event-to-/metrics latency, and memory.

- ingest: a synthetic but engine-shaped event stream (requests through their whole life, steps
  with batch rows, KV transitions, MoE counts, verifications) is written to a ring, then the
  agent's poll (read + decode + fold into state) is timed on one core. Two counts, both measured:
  records (the per-record rows the agent folds: the ring consumer's count of what it handed out, a
  batched slot counted once per entry it unbatches to, probes.record_batches) and slots (the ring's
  own unit, what `infersight_probe_events_total` counts; since ring layout 3 a slot can hold many
  records, so slots/s understates the work done). The goal (2 M/s on one core) is in records/s.
- latency: a step record is written, and /metrics is fetched until it shows it; p99 over trials.
- rss: the peak resident memory (VmHWM) of a separate `infersight agent` process after that load.
"""
from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from infersight.agent.config import AgentConfig
from infersight.agent.service import Agent
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime.observer import KVBlockEvent
from infersight.runtime.stats import StepStats


@dataclass
class AgentBenchResult:
    """All measured. records / slots: what the one timed poll took in (see the module docstring);
    ingest_seconds: its wall clock; ingest_cpu_seconds: its CPU time (process_time: user + system),
    the figure to compare on a loaded machine, where the wall clock also counts other processes'
    turns on the core. *_per_second: the count over the one or the other. dropped_slots: slots
    the ring dropped during the latency phase (the ring counts drops in slots)."""

    records: int
    slots: int
    ingest_seconds: float
    ingest_cpu_seconds: float
    records_per_second: float
    cpu_records_per_second: float
    slots_per_second: float
    cpu_slots_per_second: float
    metrics_latency_p50_s: float
    metrics_latency_p99_s: float
    peak_rss_mb: float
    dropped_slots: int


@dataclass(frozen=True)
class IngestPoll:
    """One agent poll over a pre-filled ring: records and slots it took in (AgentBenchResult), and
    its wall and CPU seconds."""

    records: int
    slots: int
    seconds: float
    cpu_seconds: float


def synthetic_workload(probe: ProbeObserver, n_requests: int, tokens_per_request: int, pause_s: float = 0.0,
                       first_id: int = 0, first_step: int = 0) -> int:
    """Requests in waves of 32, each decoded for tokens_per_request steps (pause_s between waves);
    request ids from first_id, step ids after first_step. Returns the last step id."""
    import torch  # the probe's expert counts are a tensor (loaded here: tests use this without the bench)

    t = time.monotonic_ns()
    counts = torch.randint(0, 50, (4, 8))
    step = first_step
    for wave in range(first_id, first_id + n_requests, 32):
        ids = list(range(wave, min(first_id + n_requests, wave + 32)))
        for rid in ids:
            probe.on_request_arrived(rid, t, 100, ("code", "json", "chat", "creative")[rid % 4], 0)
            probe.on_request_scheduled(rid, t + 10, 100, 32, 12345)
            probe.on_kv_block(KVBlockEvent.ALLOCATED, rid % 64, rid, 0)
            probe.on_prefill_chunk(rid, t + 10, t + 1000, 0, 100)
            probe.on_first_token(rid, t + 1000)
        for _ in range(tokens_per_request):
            step += 1
            t += 10_000
            for rid in ids:
                probe.on_tokens_emitted(rid, t, 1)
                probe.on_spec_verified(rid, 4, 2, [True, True, False], 1000, 4000)
            probe.on_expert_counts(step, counts)
            probe.on_step_end(StepStats(step, t - 9000, t, num_decode_tokens=len(ids), kv_blocks_in_use=10,
                                        kv_blocks_total=64, kv_block_size=16, batch=[(r, 1) for r in ids]))
        for rid in ids:
            probe.on_kv_block(KVBlockEvent.CACHED, rid % 64, rid, 777)
            probe.on_request_finished(rid, t + 1, "length", tokens_per_request)
        time.sleep(pause_s)
    return step


def _vm_hwm_mb(pid: int) -> float:
    """Peak resident set of a process (Linux /proc), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def ingest_poll(n_requests: int, tokens_per_request: int,
                write: Callable[[ProbeObserver], object] | None = None) -> IngestPoll:
    """One agent poll over a ring pre-filled by `write` (default: synthetic_workload of n_requests
    x tokens_per_request), timed in this process (pin it to one core). The counts are the ring
    consumer's, taken around the poll: records it handed out, slots it consumed."""
    name = f"infersight-benchagent-{time.monotonic_ns()}"
    # Pauses not timed: a collection of this process would add records no workload wrote to the counts.
    probe = ProbeObserver(ProbeConfig(ring_name=name, ring_capacity=1 << 22, nvtx=False, host_pause_min_s=None))
    agent = Agent(AgentConfig(rings=[name], port=0))
    try:
        agent.poll_once()
        consumer = agent.rings.attached[name].consumer
        if write is None:
            synthetic_workload(probe, n_requests, tokens_per_request)
        else:
            write(probe)
        records0, slots0 = consumer.records_read, consumer.stats()["consumed"]
        t0, c0 = time.perf_counter(), time.process_time()
        agent.poll_once()
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        return IngestPoll(consumer.records_read - records0, consumer.stats()["consumed"] - slots0, seconds,
                          cpu_seconds)
    finally:
        agent.close()
        probe.close()


def bench_agent(n_requests: int = 2048, tokens_per_request: int = 32, trials: int = 30) -> AgentBenchResult:
    poll = ingest_poll(n_requests, tokens_per_request)
    # Latency and memory of the agent as users run it: a separate `infersight agent` process.
    name = f"infersight-benchagent-{time.monotonic_ns()}"
    probe = ProbeObserver(ProbeConfig(ring_name=name, nvtx=False))  # the default ring size
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "infersight", "agent", "--ring", name, "--listen",
                             f"127.0.0.1:{port}", "--poll-interval", "0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60  # a loaded machine starts Python slowly
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the agent did not start") from None
                time.sleep(0.1)
        synthetic_workload(probe, n_requests, tokens_per_request, pause_s=0.01)  # steady load, then latency probes
        latencies = []
        step = 10**9
        shown = _wait_until_drained(url)  # the load's steps, as counted (events the ring dropped are not)
        for _ in range(trials):
            step += 1
            t_write = time.perf_counter()
            probe.on_step_end(StepStats(step, 0, 1000, kv_blocks_total=64, kv_block_size=16))
            give_up = time.monotonic() + 30
            while _steps_total(url) < shown + 1:
                if time.monotonic() > give_up:
                    raise RuntimeError(f"the agent never showed step {shown + 1} on /metrics")
                time.sleep(0.005)
            latencies.append(time.perf_counter() - t_write)
            shown += 1
        rss = _vm_hwm_mb(proc.pid)
    finally:
        stop_agent(proc)
        dropped = probe.ring.stats()["dropped"]
        probe.close()
    lat = sorted(latencies)
    wall, cpu = poll.seconds, poll.cpu_seconds
    return AgentBenchResult(poll.records, poll.slots, round(wall, 4), round(cpu, 4), round(poll.records / wall, 1),
                            round(poll.records / cpu, 1), round(poll.slots / wall, 1), round(poll.slots / cpu, 1),
                            round(statistics.median(lat), 4), round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 4),
                            round(rss, 1), dropped)


def stop_agent(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 15 s: never leave an agent behind (it holds the ring's lease)."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _steps_total(url: str) -> float:
    """infersight_steps_total from the agent's /metrics (0 before the first step)."""
    for line in urllib.request.urlopen(url + "/metrics", timeout=5).read().decode().splitlines():
        if line.startswith("infersight_steps_total "):
            return float(line.split()[1])
    return 0.0


def _wait_until_drained(url: str, timeout_s: float = 60.0) -> float:
    """The agent's step count once it stops moving (the ring is read to its end); counting from what it
    shows, not from what was written, keeps the bench going when the ring dropped some of the load."""
    deadline, last = time.monotonic() + timeout_s, -1.0
    while time.monotonic() < deadline:
        now = _steps_total(url)
        if now == last:
            return now
        last = now
        time.sleep(0.3)
    raise RuntimeError(f"the agent was still reading the load after {timeout_s:.0f} s")


def as_dict(result: AgentBenchResult) -> dict[str, object]:
    return asdict(result)
