"""One engine fed at a fixed batch size, with each request's decode tokens and decode time.

The requests go in with at most `batch` in flight; once the list is used up, fillers (the same
requests again, not measured) keep the batch full until every listed request has finished, and
are then aborted. So every measured request decodes beside batch - 1 others, with or without
speculation: the batch size does not drift with how fast requests finish.

A request's decode time is the sum of the durations (StepStats.start_ns .. end_ns, the engine's
own clock) of the steps it took part in after the step that gave it its first token; its decode
tokens are its output tokens less the first. Several engines stepped in turn in one process
each count only their own steps.

The client's own clock, independent of the engine's, is time.perf_counter_ns around each call
of the engine's step (DecodeTally.client_ns: summed, per request, over the same steps as its
decode time: a streaming client's first-to-last-token time) and around every step() call of the
run (wall_ns: admitting requests, the engine's step, collecting the finished, from the first
call to the one that finishes the last listed request). Several runs stepped in turn each count
only their own calls.

For diagnosis, every step of the run is also kept by kind (StepKinds: pure decode, mixed (prefill
chunks beside decodes), prefill only, a plain probe step), with the engine's step time and the
client's time around the call: where a prediction from pure-decode steps misses, these say whether
the steps it did not model (mixed ones, host time outside the engine's clock) carry the difference.
"""
from __future__ import annotations

import itertools
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pandas as pd

from infersight.runtime import Engine, SamplingParams
from infersight.runtime.stats import StepStats
from infersight.workload import WorkloadRequest


@dataclass
class DecodeTally:
    """Decode tokens and decode ns summed over the measured requests of one task: ns by the
    engine's step timestamps, client_ns by the client's clock around the same steps."""

    tokens: int = 0
    ns: int = 0
    client_ns: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.ns * 1e9 if self.ns else float("nan")

    @property
    def client_tokens_per_s(self) -> float:
        return self.tokens / self.client_ns * 1e9 if self.client_ns else float("nan")


@dataclass
class StepKinds:
    """Every step of a run by kind: engine step ns (start_ns .. end_ns), client ns around the call and the
    step's batch (requests in it)."""

    engine_ns: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    client_ns: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    batch: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    def add(self, kind: str, engine_ns: int, client_ns: int, batch: int) -> None:
        self.engine_ns[kind].append(engine_ns)
        self.client_ns[kind].append(client_ns)
        self.batch[kind].append(batch)

    def extend(self, other: StepKinds) -> None:
        for kind, ns in other.engine_ns.items():
            self.engine_ns[kind].extend(ns)
            self.client_ns[kind].extend(other.client_ns[kind])
            self.batch[kind].extend(other.batch[kind])

    def summary(self) -> dict[str, dict[str, float]]:
        """Per kind: steps, median engine ms, median client ms, median batch (measured)."""
        return {kind: {"steps": len(ns), "engine_ms": round(statistics.median(ns) / 1e6, 4),
                       "client_ms": round(statistics.median(self.client_ns[kind]) / 1e6, 4),
                       "engine_ms_total": round(sum(ns) / 1e6, 3),
                       "batch_median": statistics.median(self.batch[kind])}
                for kind, ns in sorted(self.engine_ns.items())}

    def table(self) -> pd.DataFrame:
        """One row per step, in order within each kind: kind, batch, engine_ns, client_ns."""
        kinds = sorted(self.engine_ns)
        return pd.DataFrame({"kind": [k for k in kinds for _ in self.engine_ns[k]],
                             "batch": [b for k in kinds for b in self.batch[k]],
                             "engine_ns": [n for k in kinds for n in self.engine_ns[k]],
                             "client_ns": [n for k in kinds for n in self.client_ns[k]]})


class DecodeClocks:
    """Per in-flight request, the engine's and the client's ns of the steps it decoded in (after its first
    token), and every step by kind; shared by the runs that time requests (FixedBatchRun, ArrivalRun)."""

    def __init__(self) -> None:
        self.kinds = StepKinds()
        self.decode_ns: dict[int, int] = defaultdict(int)
        self.client_ns: dict[int, int] = defaultdict(int)

    def add(self, stats: StepStats, decoding: set[int], client_ns: int) -> None:
        """One step: `decoding` held the requests that had their first token before it."""
        if stats.batch:
            self.kinds.add(step_kind(stats), stats.end_ns - stats.start_ns, client_ns, len(stats.batch))
        for rid, _ in stats.batch:
            if rid in decoding:
                self.decode_ns[rid] += stats.end_ns - stats.start_ns
                self.client_ns[rid] += client_ns

    def take(self, rid: int) -> tuple[int, int]:
        """A finished (or dropped) request's (engine ns, client ns), forgotten here."""
        return self.decode_ns.pop(rid, 0), self.client_ns.pop(rid, 0)


def step_in_turn(runs: Sequence, first: int, after_turn: Callable[[], None]) -> None:
    """Step every run (each has step() -> bool) in turn until all are done, who goes first rotating from
    `first` each turn, so that the machine's drift hits them alike; after_turn() after each turn."""
    order = list(runs)
    turn = first
    while any([r.step() for r in order[turn % len(order):] + order[:turn % len(order)]]):
        turn += 1
        after_turn()


#: step_alone's after() comes every this many steps (and at each run's end): a run's clock times its
#: step() calls only, and an async engine's launched step runs on during whatever comes between them,
#: so the bench's own work there (reading probe rings, ~0.1 ms) is kept rare.
ALONE_AFTER_EVERY = 32


def step_alone(runs: Sequence, first: int, after: Callable[[], None]) -> None:
    """Step each run to its end before the next begins, the order rotated by `first` (callers pass the
    round: drift then hits every run first in turn); after() every ALONE_AFTER_EVERY steps and at the end."""
    order = list(runs)
    for run in order[first % len(order):] + order[:first % len(order)]:
        n = 0
        while run.step():
            n += 1
            if n % ALONE_AFTER_EVERY == 0:
                after()
        after()


def step_runs(runs: Sequence, first: int, after: Callable[[], None]) -> None:
    """Step in turn (step_in_turn) where every engine is synchronous (each has run.engine); one run after
    another (step_alone) where one schedules asynchronously. An async engine's step() returns with the next
    step launched on the device: stepped in turn, that step runs on the shared GPU during the other engines'
    turns, so its time drops out of its own clock and into theirs (on the H100, 2026-12-05, the async plain
    engine's decode step read 0.21-0.25 ms on the client's clock at batch 1 for a forward of 0.51-0.55 ms
    (CUDA events), and an async probe run's steps read 35 ms: the other engines' turns between its launch
    and its read)."""
    runs = list(runs)
    if any(r.engine.config.async_scheduling for r in runs):
        step_alone(runs, first, after)
    else:
        step_in_turn(runs, first, after)


def step_kind(stats: StepStats) -> str:
    if stats.spec_probe:
        return "probe"
    if stats.num_prefill_tokens and stats.num_decode_tokens:
        return "mixed"
    return "prefill" if stats.num_prefill_tokens else "decode"


class FixedBatchRun:
    """Drive `engine` through `requests` at `batch` in flight; step() until it returns False."""

    def __init__(self, engine: Engine, requests: Sequence[WorkloadRequest], batch: int) -> None:
        self.engine = engine
        self.batch = batch
        self._queue = list(requests)
        self._fillers = itertools.cycle(requests)
        self.in_flight: dict[int, WorkloadRequest | None] = {}  # request id -> listed request (None: filler)
        self.clocks = DecodeClocks()
        self.kinds = self.clocks.kinds
        self.tally: dict[str, DecodeTally] = defaultdict(DecodeTally)
        self.remaining = len(self._queue)
        self.wall_ns = 0
        self.output_tokens = 0  # of the listed requests, as the client received them

    def _admit(self) -> None:
        while len(self.in_flight) < self.batch:
            listed = self._queue.pop(0) if self._queue else None
            r = listed if listed is not None else next(self._fillers)
            params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True, task=r.task)
            self.in_flight[self.engine.add_request(r.prompt, params)] = listed

    def step(self) -> bool:
        """One engine step; False (and no step) once every listed request has finished."""
        if not self.remaining:
            return False
        began = time.perf_counter_ns()
        self._step()
        self.wall_ns += time.perf_counter_ns() - began
        return True

    def _step(self) -> None:
        self._admit()
        decoding = {rid for rid in self.in_flight if self.engine.requests[rid].output_token_ids}
        called = time.perf_counter_ns()
        stats = self.engine.step()
        self.clocks.add(stats, decoding, time.perf_counter_ns() - called)
        for rid in stats.finished:
            listed = self.in_flight.pop(rid)
            out = self.engine.release(rid)
            ns, client_ns = self.clocks.take(rid)
            if listed is not None:
                t = self.tally[listed.task]
                t.tokens += len(out.token_ids) - 1
                t.ns += ns
                t.client_ns += client_ns
                self.output_tokens += len(out.token_ids)
                self.remaining -= 1
        if not self.remaining:
            for rid in list(self.in_flight):  # only fillers are left
                self.engine.abort_request(rid)
                self.engine.release(rid)
                self.clocks.take(rid)
            self.in_flight.clear()
