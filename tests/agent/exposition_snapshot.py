"""The agent's /metrics exposition on the demo workload, replayed deterministically.

The record stream: what an agent's ring reads got, poll by poll, while the real engine ran the agent
tests' demo workload (agent_workload.run_workload: tasks, prefix sharing, preemptions, speculation),
with the read's clock (monotonic and wall ns) -- snapshots/demo_records.npz, written by --record (it was
recorded with the engine of commit 43ed636; 104 polls, 207 KB).

The replay: a ring of a fixed name is created, and before each recorded poll that poll's records are
written to it and the clock is set to the poll's recorded time; a real Agent (its own RingConsumer,
screen, decode, folds and collectors) polls it; the exposition is what GET /metrics answers
(prometheus_client's default encoder over the agent's registry). The clock is fixed: time.monotonic,
time.time, time.perf_counter (and their _ns) read the recorded time and stand still inside a poll, so
durations the agent measures itself (its poll time) are 0 and every value is deterministic. One label
value is masked: target_info's telemetry_sdk_version, the installed OpenTelemetry SDK's (an environment's
fact, not the agent's behaviour). GPU telemetry: none (NoneCollector), so the machine's GPUs do not show; the resource's
host.name and service.instance.id are fixed through OTEL_RESOURCE_ATTRIBUTES.

The snapshot (snapshots/demo_exposition.txt, --write) was made by running this script on the commit
before the AgentConfig split; its header says which. test_exposition_unchanged.py compares byte for byte.

    python tests/agent/exposition_snapshot.py --record   # re-record the stream (runs the engine)
    python tests/agent/exposition_snapshot.py --write --commit HASH   # the snapshot, from that tree
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

HERE = Path(__file__).parent
RECORDING = HERE / "snapshots" / "demo_records.npz"
SNAPSHOT = HERE / "snapshots" / "demo_exposition.txt"
RING = "infersight-exposition-replay"
HEADER = "## "  # the snapshot's header lines; the exposition follows them
SDK_VERSION = re.compile(r'(telemetry_sdk_version=)"[^"]*"')  # the installed OpenTelemetry SDK's version


def record(path: Path = RECORDING) -> int:
    """Run the demo workload on the real engine; keep each poll's records and clock. Returns the polls."""
    from agent_workload import make_engine, run_workload, unique_ring
    from infersight.probes.records import record_registry
    from infersight.probes.ring_consumer import RingConsumer

    ring = unique_ring("exposition-rec")
    engine, probe = make_engine(ring)
    consumer = RingConsumer.attach(ring, record_registry())
    arrays: dict[str, np.ndarray] = {}
    clock: list[tuple[int, int]] = []

    def poll() -> None:
        records = consumer.read()
        consumer.commit()
        for kind, recs in sorted(records.items()):
            arrays[f"poll{len(clock):04d}_kind{kind}"] = recs
        clock.append((time.monotonic_ns(), time.time_ns()))

    try:
        run_workload(engine, poll)
        poll()  # what the last step wrote
    finally:
        consumer.close()
        probe.close()
    np.savez_compressed(path, clock=np.array(clock, np.int64), **arrays)
    return len(clock)


class FixedClock:
    """time's clocks, set by the replay; they stand still between sets."""

    NAMES = ("monotonic", "monotonic_ns", "time", "time_ns", "perf_counter", "perf_counter_ns")

    def __init__(self, mono_ns: int, wall_ns: int) -> None:
        self.mono_ns, self.wall_ns = mono_ns, wall_ns

    def set(self, mono_ns: int, wall_ns: int) -> None:
        self.mono_ns, self.wall_ns = mono_ns, wall_ns

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        saved = {name: getattr(time, name) for name in self.NAMES}
        time.monotonic = time.perf_counter = lambda: self.mono_ns / 1e9  # type: ignore[assignment]
        time.monotonic_ns = time.perf_counter_ns = lambda: self.mono_ns  # type: ignore[assignment]
        time.time = lambda: self.wall_ns / 1e9  # type: ignore[assignment]
        time.time_ns = lambda: self.wall_ns  # type: ignore[assignment]
        try:
            yield
        finally:
            for name, fn in saved.items():
                setattr(time, name, fn)


def _config(ring: str) -> Any:
    """The agent's config: the ring, an ephemeral port, a token (no token file), slow requests judged
    from 2 finished ones (the workload has 6). Written for both sides of the AgentConfig split (issue
    31 item 4), so that this one script makes the snapshot before it and the comparison after it."""
    from infersight.agent.config import AgentConfig

    try:
        from infersight.agent.capture.config import CaptureConfig
        from infersight.agent.slow.config import SlowRequestConfig
    except ImportError:  # before the split: flat fields
        return AgentConfig(rings=[ring], port=0, token="replay", min_requests_for_p99=2)  # type: ignore[call-arg]
    return AgentConfig(rings=[ring], port=0, captures=CaptureConfig(token="replay"),
                       slow=SlowRequestConfig(min_requests_for_p99=2))


def replay(path: Path = RECORDING) -> str:
    """The exposition after the recorded stream was fed to an agent, poll by poll, on the fixed clock."""
    from prometheus_client.exposition import choose_encoder

    from infersight.agent.service import Agent
    from infersight.gpu.none_collector import NoneCollector
    from infersight.probes.records import record_dtype, record_registry
    from infersight.probes.ring import RingProducer

    def widened(kind: int, recs: np.ndarray) -> np.ndarray:
        """A record of an older layout (a kind's version since grown by fields, as STEP_TIMING v2's
        profiled and kv_moves) in the current one, its new fields 0: what the recorded engine had
        no field for, it did not do."""
        dtype = record_dtype(kind)
        if recs.dtype == dtype:
            return recs
        out = np.zeros(len(recs), dtype)
        for name in recs.dtype.names:
            out[name] = recs[name]
        return out

    data = np.load(path)
    clock_rows = data["clock"].tolist()
    per_poll: dict[int, list[tuple[int, np.ndarray]]] = {}
    for key in data.files:
        if key.startswith("poll"):
            poll, kind = key.removeprefix("poll").split("_kind")
            per_poll.setdefault(int(poll), []).append((int(kind), widened(int(kind), data[key])))
    most = max(sum(len(r) for _, r in recs) for recs in per_poll.values())
    capacity = 1 << max(10, int(most * 2).bit_length())
    clock = FixedClock(*clock_rows[0])
    os.environ["OTEL_RESOURCE_ATTRIBUTES"] = "host.name=replay,service.instance.id=replay"
    os.environ.pop("OTEL_SERVICE_NAME", None)
    with clock.installed():
        create = RingProducer.create
        # No heartbeat thread where the ring has one (a later ring layout): its beats would read the fixed clock.
        beat = {"beat_interval_s": None} if "beat_interval_s" in inspect.signature(create).parameters else {}
        producer = create(RING, capacity, None, record_registry(), **beat)
        try:
            agent = Agent(_config(RING), gpu_collector=NoneCollector())
            try:
                for poll, (mono_ns, wall_ns) in enumerate(clock_rows):
                    clock.set(mono_ns, wall_ns)
                    for kind, recs in sorted(per_poll.get(poll, []), key=lambda kr: kr[0]):
                        assert producer.write_many(kind, recs) == len(recs), "the replay ring is too small"
                    agent.poll_once()
                encoder, _ = choose_encoder("")  # GET /metrics without an Accept header
                return SDK_VERSION.sub(r'\1"(masked)"', encoder(agent.registry).decode())
            finally:
                agent.close()
        finally:
            producer.close()
            producer.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="re-record the stream (runs the engine)")
    parser.add_argument("--write", action="store_true", help="write the snapshot (else print the exposition)")
    parser.add_argument("--commit", default="", help="the commit whose tree is imported (for the header)")
    args = parser.parse_args()
    if args.record:
        print(f"{record()} polls recorded to {RECORDING}")
        return
    text = replay()
    if not args.write:
        sys.stdout.write(text)
        return
    header = [f"python tests/agent/exposition_snapshot.py --write, importing infersight from a git archive of commit "
              f"{args.commit or '(not given)'}",
              f"replaying {RECORDING.name} ({len(np.load(RECORDING)['clock'])} polls) on a fixed clock: every value "
              "deterministic; masked: target_info's telemetry_sdk_version (the installed SDK's)"]
    SNAPSHOT.write_text("".join(HEADER + line + "\n" for line in header) + text)


if __name__ == "__main__":
    main()
