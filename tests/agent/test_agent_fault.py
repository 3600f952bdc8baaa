"""Fault test: a real engine writes into its ring under load while `infersight agent` processes are
started, refused, SIGKILLed and restarted beside it. Every event is accounted for exactly:

    produced (counted engine side, at every ring write call; and the writer's own ring counter)
      == delivered (by the killed agent, then by its successor) + dropped (ring full while no agent
         read) + corrupt + lost (the batch the killed agent had taken but not yet folded in)

and requests in flight at the kill are counted as orphaned, within bounds taken from the engine's
own request timestamps. An agent started on a ring another agent reads is refused, naming its pid.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from agent_workload import TINY, free_port, unique_ring
from testkit import wait_for_process

from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer, RingProducer
from infersight.probes.ring_lease import IN_FLIGHT
from infersight.runtime import Engine, EngineConfig, SamplingParams

REPO = Path(__file__).resolve().parents[2]
CAPACITY = 1024  # ~1 s of this load (a step is ~4 slots: TOKENS and members batched): a restart overflows it
CONCURRENT = 6  # requests in flight at all times
MAX_TOKENS = 110  # the longest (60..110 tokens); with 10 prompt tokens, within TINY's 128; in flight across the kill


class EngineEvents:
    """Every ring write call of this process, counted before the ring sees it (engine side)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        write, write_many = RingProducer.write, RingProducer.write_many

        def counted_write(ring: RingProducer, kind: int, record: object) -> bool:
            self.n += 1
            return write(ring, kind, record)

        def counted_many(ring: RingProducer, kind: int, records: object) -> int:
            self.n += len(records)  # type: ignore[arg-type]
            return write_many(ring, kind, records)

        monkeypatch.setattr(RingProducer, "write", counted_write)
        monkeypatch.setattr(RingProducer, "write_many", counted_many)
        write_slots = RingProducer.write_slots

        def counted_slots(ring: RingProducer, rows: object) -> int:  # a step's records (probes.step_block)
            self.n += len(rows)  # type: ignore[arg-type]
            return write_slots(ring, rows)

        monkeypatch.setattr(RingProducer, "write_slots", counted_slots)


class LoadedEngine(threading.Thread):
    """The engine, stepping with CONCURRENT requests at all times until `finish` is set, then until the
    requests in flight are done (or until `halt`)."""

    def __init__(self, ring: str, events: EngineEvents) -> None:
        super().__init__(daemon=True, name="engine")
        self.events = events
        self.probe = ProbeObserver(ProbeConfig(ring_name=ring, ring_capacity=CAPACITY, nvtx=False))
        self.engine = Engine(EngineConfig(model=TINY, num_kv_blocks=128, block_size=8), self.probe)
        self.halt, self.finish = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.counts: list[tuple[int, int]] = []  # (monotonic ns, events written so far) after each step

    def run(self) -> None:
        try:
            n = 0
            while not self.halt.is_set() and not (self.finish.is_set() and not self.engine.has_unfinished()):
                while not self.finish.is_set() and sum(r.times.finish_ns is None
                                                       for r in self.engine.requests.values()) < CONCURRENT:
                    # Lengths differ so requests end at different steps: equal ones would start and end
                    # in lockstep cohorts, and a kill just after a cohort's end spans no request. Not
                    # cycling with the slots either: 110 - 10 x (n % 6) put every replacement's end on the
                    # same step (the first six end at 60..110, their successors all at 170, and so on), and
                    # a kill just after step 170k spanned none (CI run of 2026-12-05: "spanning 0").
                    tokens = MAX_TOKENS - (n * 37) % 51
                    self.engine.add_request([1 + n % 50] * 10, SamplingParams(temperature=0, max_tokens=tokens,
                                                                               ignore_eos=True))
                    n += 1
                self.engine.step()
                self.counts.append((time.monotonic_ns(), self.events.n))
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def times(self) -> list[tuple[int, int | None]]:
        """(arrival, finish) of every request; safe beside the engine thread (list() holds the GIL)."""
        return [(r.times.arrival_ns, r.times.finish_ns) for r in list(self.engine.requests.values())]


class Agent:
    def __init__(self, ring: str | None, home: Path, log: Path, *more: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
        env.pop("XDG_RUNTIME_DIR", None)
        with open(log, "wb") as out:
            rings = ["--ring", ring] if ring else []
            self.proc = subprocess.Popen([sys.executable, "-m", "infersight", "agent", *rings, "--listen",
                                          f"127.0.0.1:{self.port}", "--poll-interval", "0.05", "--gpu-source",
                                          "none", *more], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=out)

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def summary(self) -> dict:
        return httpx.get(self.base + "/api/v1/summary", timeout=5).json()

    def wait_for(self, what: str, check, timeout: float = 30.0):
        return wait_for_process(self.proc, lambda: self.log, what, check, timeout, (httpx.HTTPError,))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def test_kill_and_restart_the_agent_under_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = EngineEvents(monkeypatch)
    ring = unique_ring("fault")
    load = LoadedEngine(ring, events)
    agents: list[Agent] = []
    try:
        load.start()
        first = Agent(ring, tmp_path, tmp_path / "agent1.log")
        agents.append(first)
        first.wait_for("the ring", lambda: first.summary()["rings"].get(ring, {}).get("consumed", 0) > 0)

        before = first.summary()  # what the first agent had delivered, at least
        assert before["rings"][ring]["reader_pid"] == first.proc.pid

        def behind() -> int:  # read from the ring's header in this (the engine's) process: no HTTP lag
            st = load.probe.ring.stats()
            return st["produced"] - st["consumed"] - st["corrupt"] - st["dropped_seen"]

        deadline = time.monotonic() + 20
        while behind() > 50 and time.monotonic() < deadline:
            time.sleep(0.002)  # kill it just after a read, so requests in flight span the kill
        # -- SIGKILL it under load; nobody reads for a while: the ring overflows --------------------
        first.proc.send_signal(signal.SIGKILL)
        t_kill = time.monotonic_ns()
        first.proc.wait(30)
        at_kill = load.probe.ring.stats()  # the dead reader's last word, frozen in the ring
        words = memoryview(Path(f"/dev/shm/{ring}").read_bytes()[:192]).cast("Q")
        in_flight_at_kill = int(words[IN_FLIGHT])
        # Nobody reads while the successor starts (seconds, > 5 ring's worth of events): drops.
        restarted = Agent(ring, tmp_path, tmp_path / "agent2.log")
        agents.append(restarted)
        restarted.wait_for("the takeover", lambda: restarted.summary()["rings"].get(ring))
        t_attach = time.monotonic_ns()
        drops: list[tuple[int, int]] = []  # (when, dropped) as the successor reports them
        deadline = time.monotonic() + 20
        while not drops or drops[-1][0] - next(t for t, d in drops if d == drops[-1][1]) < 1_000_000_000:
            assert time.monotonic() < deadline, f"the successor keeps dropping: {drops[-5:]}"
            drops.append((time.monotonic_ns(), restarted.summary()["rings"][ring]["dropped"]))
            time.sleep(0.1)  # until a second has passed without a drop, requests arriving all along
        t_quiet = next(t for t, d in drops if d == drops[-1][1])  # no drop since
        while sum(a > t_quiet for a, _ in load.times()) < 3:  # a few requests that begin and end with it
            assert time.monotonic() < deadline, "no requests arrive"
            time.sleep(0.05)
        load.finish.set()  # no new requests; those in flight run to the end
        load.join(60)
        assert load.error is None and not load.is_alive()
        produced = events.n
        final = restarted.wait_for("the drain", lambda: (s := restarted.summary())["rings"][ring]["consumed"]
                                   + s["rings"][ring]["dropped_seen"] + s["rings"][ring]["reader_lost"]
                                   + s["rings"][ring]["corrupt"] == produced and s)
        st = final["rings"][ring]
    finally:
        load.halt.set()
        for agent in agents:
            agent.stop()
        load.join(30)
        load.probe.close()

    lost = int(restarted.log.split(f"took over the reader lease of pid {first.proc.pid} (gone); ")[1].split()[0])
    figures = {k: st[k] for k in ("produced", "consumed", "delivered_before", "dropped", "dropped_seen",
                                  "reader_lost", "corrupt")}
    print(f"\nfault test figures: engine-side produced {produced}, {figures}, "
          f"orphaned {final['requests_orphaned']}, requests after restart {final['requests']}")
    # -- events: exact -------------------------------------------------------------------------------
    assert st["produced"] == produced  # the writer's own counter agrees with the engine-side count
    assert produced == st["consumed"] + st["dropped_seen"] + st["corrupt"] + st["reader_lost"]
    assert st["dropped_seen"] == st["dropped"] > 0  # lost while no agent read: counted as drops
    assert st["reader_lost"] == lost == final["lost_events"] == in_flight_at_kill
    assert st["delivered_before"] >= before["rings"][ring]["consumed"] - before["rings"][ring]["in_flight"]
    assert st["corrupt"] == 0 and final["dropped_events"] == st["dropped"]
    # -- requests in flight at the kill: orphaned, not lost ----------------------------------------------
    # Bounds from the engine's own clock. Events numbered below c1 (the dead reader's next sequence number)
    # were taken by the first agent or dropped before it attached; the engine counted its writes after
    # every step, so an event written before a step-end where the count was <= c1 is one of them.
    c1 = at_kill["consumed"] + at_kill["corrupt"] + at_kill["dropped_seen"]
    t_read = max(t for t, n in load.counts if n <= c1)
    times = load.times()

    def count_at(t_ns: int) -> int:
        """Events written by the end of the step in which time t_ns falls."""
        return next(n for t, n in load.counts if t >= t_ns)

    # Surely orphaned: ARRIVED taken by the first agent (or dropped), FINISHED written after the kill while
    # the ring still had room (CAPACITY slots beyond those the first agent had freed).
    low = sum(a < t_read and f is not None and f > t_kill and count_at(f) < c1 + CAPACITY for a, f in times)
    # Could be orphaned: FINISHED numbered c1 or later (the first agent may not have read it).
    high = sum(f is not None and f > t_read for a, f in times)
    print(f"orphaned bounds from the engine's clock: {low} <= {final['requests_orphaned']} <= {high}; "
          f"first agent behind by {(t_kill - t_read) / 1e6:.0f} ms, {count_at(t_kill) - c1} events at the kill; "
          f"spanning {sum(a < t_read and f is not None and f > t_kill for a, f in times)}")
    assert 1 <= low <= final["requests_orphaned"] <= high
    # Every request that finished after the drops stopped is in the successor's rows or orphaned, and
    # every one that also arrived after that has a row.
    assert final["rings"][ring]["dropped"] == drops[-1][1]  # none after t_quiet
    assert all(f is not None for _, f in times)
    assert sum(f > t_quiet for _, f in times) <= final["requests"] + final["requests_orphaned"]
    assert 3 <= sum(a > t_quiet for a, _ in times) <= final["requests"]
    assert t_attach > t_kill


def test_second_agent_on_a_named_ring_is_refused(tmp_path: Path) -> None:
    """This process holds the ring's lease (a reader); `infersight agent --ring` exits 2 with one line."""
    ring = unique_ring("refused")
    with RingProducer.create(ring, 16, None, record_registry()), RingConsumer.attach(ring, record_registry()) as me:
        me.read()
        res = subprocess.run([sys.executable, "-m", "infersight", "agent", "--ring", ring, "--listen",
                              f"127.0.0.1:{free_port()}", "--gpu-source", "none"], cwd=REPO, timeout=60,
                             env={**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)},
                             capture_output=True, text=True)
        assert me.read() == {} and me.stats()["reader_pid"] == os.getpid()  # still ours
    errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert errors[0] == (f"infersight: error: ring {ring!r} is already read by agent pid {os.getpid()} "
                         f"(last read {errors[0].split('(last read ')[1].split(' s ago')[0]} s ago); "
                         "a ring has one reader: stop that agent first")


_ENGINE = """
import sys, time
from multiprocessing import resource_tracker
from infersight.probes.records import record_registry
from infersight.probes.ring import RingProducer
ring = RingProducer.create(sys.argv[1], 64, None, record_registry())
resource_tracker.unregister("/" + sys.argv[1], "shared_memory")  # as if the tracker died with the engine
print("ready", flush=True)
time.sleep(120)
"""


def test_a_killed_engines_ring_leaves_discovery_and_health(tmp_path: Path) -> None:
    prefix = unique_ring("stale") + "-"
    ring = prefix + "engine"
    engine = subprocess.Popen([sys.executable, "-c", _ENGINE, ring], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    agent = None
    try:
        assert engine.stdout.readline().strip() == "ready"
        agent = Agent(None, tmp_path, tmp_path / "agent.log", "--discover", "--discover-prefix", prefix)
        agent.wait_for("the engine's ring", lambda: httpx.get(agent.base + "/health").json()["rings"] == [ring])
        engine.send_signal(signal.SIGKILL)
        engine.wait(30)
        agent.wait_for("the ring to leave /health", lambda: httpx.get(agent.base + "/health").json()["rings"] == [])
        time.sleep(2.5)  # past the retry interval: discovery does not bring it back
        assert httpx.get(agent.base + "/health").json()["rings"] == []
        assert not os.path.exists(f"/dev/shm/{ring}")  # the agent removed it
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait(30)
        if agent is not None:
            agent.stop()
    assert f"its writer, pid {engine.pid}, has exited; drained and removed" in agent.log
