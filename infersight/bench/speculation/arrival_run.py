"""One engine fed by a workload's arrival times, on the run's own clock: the demo's load, timed so that
several engines can be stepped in turn in one process and each still sees its own arrivals.

`infersight demo` admits each request when its arrival time (WorkloadRequest.arrival_s) has passed on
the wall clock. Engines stepped in turn share the wall clock, so here each run keeps its own: the
client's time (time.perf_counter_ns) around each of its own step() calls, summed, and, when its engine
has nothing to run, a jump to the next arrival (an idle server waits for it). A slower engine thus sees
the same arrivals as it would alone: more requests waiting at each step, a larger batch. A run's clock is
the demo's wall clock with the other engines' turns taken out.

Per request, as FixedBatchRun counts it (bench.speculation.fixed_batch): decode tokens (its output tokens less the
first) and the client's time around the steps it decoded in (a streaming client's first-to-last-token
time), summed per task in `tally`; also its TTFT on the run's clock (first token less arrival), per task.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Sequence

from infersight.bench.speculation.fixed_batch import DecodeClocks, DecodeTally
from infersight.runtime import Engine, SamplingParams
from infersight.workload import WorkloadRequest


class ArrivalRun:
    """Drive `engine` through `requests` as they arrive; step() until it returns False."""

    def __init__(self, engine: Engine, requests: Sequence[WorkloadRequest]) -> None:
        self.engine = engine
        self._pending = sorted(requests, key=lambda r: r.arrival_s)
        self.clock_ns = 0  # the run's own clock (module docstring)
        self.in_flight: dict[int, tuple[WorkloadRequest, int]] = {}  # request id -> (request, arrival ns)
        self.clocks = DecodeClocks()
        self.kinds = self.clocks.kinds
        self.tally: dict[str, DecodeTally] = defaultdict(DecodeTally)
        self.ttft_ns: dict[str, list[int]] = defaultdict(list)
        self.remaining = len(self._pending)
        self.output_tokens = 0
        self._first_seen: set[int] = set()

    def step(self) -> bool:
        """Admit what has arrived by the run's clock, then one engine step; False (and no step) once every
        request has finished."""
        if not self.remaining:
            return False
        if not self.engine.has_unfinished() and self._pending:
            self.clock_ns = max(self.clock_ns, round(self._pending[0].arrival_s * 1e9))  # idle: wait for it
        began = time.perf_counter_ns()
        while self._pending and self._pending[0].arrival_s * 1e9 <= self.clock_ns:
            r = self._pending.pop(0)
            params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True, task=r.task)
            self.in_flight[self.engine.add_request(r.prompt, params)] = (r, round(r.arrival_s * 1e9))
        decoding = {rid for rid in self.in_flight if self.engine.requests[rid].output_token_ids}
        called = time.perf_counter_ns()
        stats = self.engine.step()
        returned = time.perf_counter_ns()
        self.clock_ns += returned - began
        self.clocks.add(stats, decoding, returned - called)
        for rid, _ in stats.batch:
            if rid not in decoding and rid not in self._first_seen and self.engine.requests[rid].output_token_ids:
                self._first_seen.add(rid)
                request, arrived = self.in_flight[rid]
                self.ttft_ns[request.task].append(self.clock_ns - arrived)
        for rid in stats.finished:
            request, _ = self.in_flight.pop(rid)
            out = self.engine.release(rid)
            self._first_seen.discard(rid)
            t = self.tally[request.task]
            ns, client_ns = self.clocks.take(rid)
            t.tokens += len(out.token_ids) - 1
            t.ns += ns
            t.client_ns += client_ns
            self.output_tokens += len(out.token_ids)
            self.remaining -= 1
        return True
