"""ArrivalRun on tiny cases with the shipped model: requests go in when the run's own clock reaches their
arrival, an idle engine's clock jumps to the next arrival, and per task the decode tokens and times add
up to what the requests produced."""
from __future__ import annotations

from testkit import one_torch_thread

from infersight.bench.speculation.arrival_run import ArrivalRun
from infersight.runtime import Engine, EngineConfig
from infersight.workload import WorkloadRequest

LATE_S = 1000.0  # far beyond the first requests' service: the engine is idle before it comes


def _engine() -> Engine:
    return Engine(EngineConfig(model="tiny-moe", device="cpu", max_num_seqs=4, max_num_batched_tokens=256,
                               num_kv_blocks=64))


def test_the_clock_waits_for_an_arrival_and_the_tallies_add_up() -> None:
    requests = [WorkloadRequest(0.0, "code", "def f(x):", 5), WorkloadRequest(0.0, "chat", "Say hi.", 3),
                WorkloadRequest(LATE_S, "code", "import os", 4)]
    with one_torch_thread():
        run = ArrivalRun(_engine(), requests)
        admitted_at: list[tuple[int, int]] = []  # (requests in flight, clock) before each step
        while True:
            admitted_at.append((len(run.in_flight), run.clock_ns))
            if not run.step():
                break
    assert run.remaining == 0 and not run.in_flight
    # Before the late request's first step the clock stood below LATE_S with nothing in flight: the jump.
    jumped = [clock for flight, clock in admitted_at if flight == 0]
    assert jumped[0] == 0 and any(clock < LATE_S * 1e9 for clock in jumped[1:-1])
    # The run's clock: the jump to LATE_S plus the client's time of the steps after it (all of them > 0).
    assert LATE_S * 1e9 < run.clock_ns < LATE_S * 1e9 + 60e9
    assert run.output_tokens == 5 + 3 + 4
    assert (run.tally["code"].tokens, run.tally["chat"].tokens) == ((5 - 1) + (4 - 1), 3 - 1)
    for task in ("code", "chat"):
        assert 0 < run.tally[task].client_ns < run.clock_ns and run.tally[task].ns > 0
    # TTFT on the run's clock: one per request, the late one measured from its own arrival.
    assert len(run.ttft_ns["code"]) == 2 and len(run.ttft_ns["chat"]) == 1
    assert all(0 < t < 60e9 for ts in run.ttft_ns.values() for t in ts)


def test_requests_that_arrive_together_are_admitted_together() -> None:
    requests = [WorkloadRequest(0.0, "json", f"{{\"n\": {i}}}", 2) for i in range(3)]
    with one_torch_thread():
        run = ArrivalRun(_engine(), requests)
        assert run.step()
    assert len(run.in_flight) == 3  # all three went in before the first step, none waited a step


def test_every_step_is_kept_with_its_kind_and_batch() -> None:
    # Two requests together (3 tokens each: a prefill that gives the first, then two decode steps of both),
    # then one alone after the engine went idle (2 tokens: its prefill, then one decode step).
    requests = [WorkloadRequest(0.0, "code", "def f(x):", 3), WorkloadRequest(0.0, "chat", "Say hi.", 3),
                WorkloadRequest(LATE_S, "json", "{\"a\": 1}", 2)]
    with one_torch_thread():
        run = ArrivalRun(_engine(), requests)
        while run.step():
            pass
    table = run.kinds.table()
    assert table[["kind", "batch"]].values.tolist() == [["decode", 2], ["decode", 2], ["decode", 1],
                                                        ["prefill", 2], ["prefill", 1]]
    summary = run.kinds.summary()
    assert {k: (v["steps"], v["batch_median"]) for k, v in summary.items()} == {"decode": (3, 2), "prefill": (2, 1.5)}
