"""The closed loop's max_num_seqs trial, live: our engine (shipped tiny-moe, CPU) under a closed loop of
CLIENTS concurrent clients, an agent with `--auto-apply max-num-seqs --auto-apply-seq-candidates 2`,
and an SLO that decides (two alternating windows of 4 s: the candidate, then the configured 8):

    keep      strict ITL objective, loose TTFT: at the configured limit (8) the batch is large and
              every step slow, so each request misses the ITL objective; at the candidate (2) steps
              are short (requests queue, but the TTFT objective allows it): the loop keeps 2
    rollback  strict TTFT objective, loose ITL: at 8 most requests start at once; at 2 each waits
              for a slot and misses the TTFT objective: the loop rolls back to 8

The step cost. On this CPU a decode step of tiny-moe costs ~6.7 ms at batch 1 and ~11 ms at batch 8
(measured, one torch thread, unloaded): too little batch dependence to decide in seconds on a shared
2-core machine. So a test-only observer makes a step's cost grow with its batch (as attention over
each sequence's KV does on a large model): it sleeps PER_SEQ_S per sequence that emitted a token,
inside every step (before the step's end is stamped). Everything else is the engine's own (its
scheduler queues what the limit leaves out). The candidate is 2, not the default half (4), so that
the two settings stay apart when load on the machine stretches the engine's own part of a step.

The objectives. How fast the engine runs depends on what else the machine runs, so before the agent
starts the test drives the same load at each limit for ~2 s (the limit set on the engine directly)
and sets the strict objective from what the client saw: each at the geometric mean of the two limits'
medians. At the configured limit TTFTs are multimodal: a request that finds a slot free starts at the
next step (~0.11 s here); one of the two clients beyond the limit waits for a cohort to finish (~0.43 s
in a steady run, 0.23-0.7 s just after the candidate's window); at the candidate nearly every request
waits (0.73-0.94 s). The geometric mean (0.29-0.37 s measured) falls between the configured limit's
first two modes, so its waiters miss (something to gain: the loop proposes) while most requests meet
it. Two placements failed in CI: the configured limit's 75th percentile fell on the lower mode when
the ~14 calibration requests held few waiters (0.120 s: 12% met it in the trial, too few to tell the
limits apart); halfway between the medians (~0.45 s) sat on the waiters' mode. And in 1 of 5 runs at
either objective the loop proposed nothing in 60 s: it judged "missed at all" on the last 6 finished
requests, and a cohort's waiters finish first in its step, so the last 6 were always those that found a
slot free; it now judges the requests finished within a window of time (agent.autoapply.seq_trial, with
its own test in test_autoapply_state_machine.py). The loose one is 60 s.

The truth is measured on the client's clock, independently of the probe records the loop reads:
each request's TTFT (first token seen after a step minus the time before add_request) and mean ITL
((last - first token) / (tokens - 1)), grouped by the limit the engine had when the request arrived,
a request counting for its window only if it finished (client clock) before the engine took the next
policy generation (the loop's rule, on the client's side). The test asserts that the truth is
decisive, that the loop's decision agrees with it, and that the decision's numbers (SLO shares,
request counts) agree with the client's. Timings are wall-clock on a shared machine: noisy; the
effects built here are 2x and more.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from testkit import one_torch_thread, unique_ring

from infersight.agent.autoapply.config import AutoApplyConfig
from infersight.agent.config import AgentConfig
from infersight.agent.service import Agent
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig, SamplingParams
from infersight.runtime.engine.run_policy import RunPolicy

CLIENTS = 10
MAX_NUM_SEQS = 8
CANDIDATE = 2  # --auto-apply-seq-candidates 2: far enough from 8 that load on the machine cannot blur the two
MAX_TOKENS = 6
PER_SEQ_S = 0.012
POLL_S = 0.5  # the loop looks at most every 0.5 s anyway (autoapply.part.TICK_S)
PROMPT = "def fibonacci(n):\n    # return the n-th Fibonacci number, iteratively\n"


class BatchCost(ProbeObserver):
    """Test-only: every step costs PER_SEQ_S more per sequence it will run (those running and waiting, up
    to the scheduler's limit), spent as it begins, before any of its tokens is stamped, as a forward's time
    is. Spent after the stamps, as it once was, it put the engine's token times up to ~0.1 s before the
    client saw them: the loop's TTFTs sat below an objective taken on the client's clock, and the loop,
    rightly, proposed nothing in about half the runs."""

    batch: Callable[[], int] = staticmethod(lambda: 0)

    def on_step_begin(self, step_id: int, t_ns: int) -> None:
        time.sleep(PER_SEQ_S * self.batch())
        super().on_step_begin(step_id, t_ns)


@dataclass
class Seen:
    """One request as its client saw it (perf_counter seconds)."""

    seq: int    # the engine's policy generation when it arrived
    limit: int  # the engine's max_num_seqs then
    sent: float
    first: float = float("nan")
    last: float = float("nan")
    tokens: int = 0

    @property
    def ttft_s(self) -> float:
        return self.first - self.sent

    @property
    def itl_s(self) -> float:
        return (self.last - self.first) / (self.tokens - 1)


class LoadedRun:
    def __init__(self) -> None:
        self.ring = unique_ring("seqtrial")
        self.probe = BatchCost(ProbeConfig(ring_name=self.ring))
        self.engine = Engine(EngineConfig(model="tiny-moe", max_num_seqs=MAX_NUM_SEQS, num_kv_blocks=64,
                                          block_size=16), self.probe)
        sched = self.engine.scheduler
        self.probe.batch = lambda: min(len(sched.running) + len(sched.waiting), sched.max_num_seqs)
        self.loop: AutoApplyConfig | None = None
        self.agent: Agent | None = None
        self.seen: dict[int, Seen] = {}
        self.open: set[int] = set()
        self.taken: dict[int, float] = {}  # policy generation -> client time just before the engine took it

    def _call(self, fn, *args):  # type: ignore[no-untyped-def]
        before_t, before_seq = time.perf_counter(), self.engine.policy.seq
        out = fn(*args)
        if self.engine.policy.seq != before_seq:
            self.taken[self.engine.policy.seq] = before_t
        return out

    def _send(self) -> None:
        sent = time.perf_counter()
        rid = self._call(self.engine.add_request, PROMPT, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                                          ignore_eos=True, task="code"))
        self.seen[rid] = Seen(self.engine.policy.seq, self.engine.scheduler.max_num_seqs, sent)
        self.open.add(rid)

    def _step(self) -> None:
        """One engine step; each client whose request finished sends its next (a closed loop)."""
        self._call(self.engine.step)
        now = time.perf_counter()
        for rid in list(self.open):
            req, s = self.engine.requests[rid], self.seen[rid]
            if len(req.output_token_ids) > s.tokens:
                s.tokens, s.last = len(req.output_token_ids), now
                s.first = now if np.isnan(s.first) else s.first
            if req.is_finished:
                self.open.discard(rid)
                self._send()

    def calibrate(self, limit: int, seconds: float) -> list[Seen]:
        """The load at `limit` (set directly on the engine, no agent yet) for `seconds`: the requests
        that arrived and finished inside, on the client's clock."""
        self.engine.apply_policy(RunPolicy(max_num_seqs=limit))
        while len(self.open) < CLIENTS:
            self._send()
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            self._step()
        return [s for s in self.seen.values() if s.sent >= start and s.tokens == MAX_TOKENS and s.limit == limit]

    def start_agent(self, slo_ttft_s: float, slo_itl_s: float) -> None:
        self.engine.apply_policy(RunPolicy())  # the configured limit again; from here only the agent sets one
        self.loop = AutoApplyConfig(knobs=("max-num-seqs",), min_requests=6, cooldown_s=600, slo_ttft_s=slo_ttft_s,
                                    slo_itl_s=slo_itl_s, seq_window_s=4.0, seq_windows=2,
                                    seq_candidates=(CANDIDATE,))
        self.agent = Agent(AgentConfig(rings=[self.ring], port=0, auto_apply=self.loop))

    def drive(self, deadline_s: float) -> str | None:
        """The clients' load until the trial's verdict (its stage) or the deadline."""
        assert self.agent is not None
        next_poll, deadline = time.perf_counter() + POLL_S, time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            self._step()
            if time.perf_counter() >= next_poll:  # the agent reads between steps (one thread); both limits pay it
                self.agent.poll_once()
                next_poll = time.perf_counter() + POLL_S
                verdicts = [d.stage for d in self.agent.autoapply.decisions if d.stage in ("kept", "rolled_back")]
                if verdicts:
                    for _ in range(3):  # the engine takes the verdict's policy at its next step
                        self._call(self.engine.step)
                    self._send()
                    return verdicts[0]
        return None

    def client_windows(self, windows: list[dict]) -> dict[int, list[Seen]]:
        """limit -> the requests of the trial's windows, on the client's clock (module docstring)."""
        out: dict[int, list[Seen]] = {}
        for w in windows:
            end = self.taken.get(w["policy_seq"] + 1, float("inf"))
            out.setdefault(w["max_num_seqs"], []).extend(
                s for s in self.seen.values() if s.seq == w["policy_seq"] and s.tokens == MAX_TOKENS and s.last < end)
        return out

    def met(self, requests: list[Seen]) -> float:
        assert self.loop is not None and self.loop.slo_ttft_s is not None and self.loop.slo_itl_s is not None
        return float(np.mean([s.ttft_s <= self.loop.slo_ttft_s and s.itl_s <= self.loop.slo_itl_s for s in requests]))

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()
        self.probe.close()


def _trial(strict: str) -> tuple[LoadedRun, str | None]:
    """Calibrate on this machine now (the client's clock, no agent yet), then the trial. strict "itl":
    the ITL objective between the two limits' median ITLs, the TTFT one loose; strict "ttft": the TTFT
    objective between the two limits' median TTFTs, the ITL one loose (geometric means; module docstring)."""
    run = LoadedRun()
    with one_torch_thread():
        at = {limit: run.calibrate(limit, seconds) for limit, seconds in ((CANDIDATE, 2.5), (MAX_NUM_SEQS, 2.0))}
        between = {key: float(np.sqrt(np.prod([np.median([getattr(s, key) for s in at[limit]])
                                               for limit in (CANDIDATE, MAX_NUM_SEQS)])))
                   for key in ("itl_s", "ttft_s")}
        if strict == "itl":
            run.start_agent(slo_ttft_s=60.0, slo_itl_s=between["itl_s"])
        else:
            run.start_agent(slo_ttft_s=between["ttft_s"], slo_itl_s=60.0)
        stage = run.drive(deadline_s=60)
    return run, stage


def _check(run: LoadedRun, stage: str | None, expected: str) -> tuple[dict[int, float], dict]:
    """The client's truth, the loop's decision, and their agreement; returns (client share by limit,
    the verdict's numbers)."""
    decisions = [d for d in run.agent.autoapply.decisions if d.knob == "max_num_seqs"]
    assert [d.stage for d in decisions] == ["proposed", "canaried", expected], [d.reason for d in decisions]
    assert stage == expected
    verdict = decisions[-1].numbers
    current, candidate = decisions[-1].before, decisions[-1].after
    assert (current, candidate) == (MAX_NUM_SEQS, CANDIDATE)
    by_limit = run.client_windows(verdict["windows"])
    share = {limit: run.met(reqs) for limit, reqs in by_limit.items()}
    described = {limit: f"{share[limit]:.0%} of {len(reqs)} met the SLO, median TTFT "
                        f"{np.median([s.ttft_s for s in reqs]) * 1e3:.0f} ms, median ITL "
                        f"{np.median([s.itl_s for s in reqs]) * 1e3:.1f} ms (client clock)"
                 for limit, reqs in by_limit.items()}
    print(f"{expected}: SLO TTFT {run.loop.slo_ttft_s:.3f} s, ITL {run.loop.slo_itl_s:.4f} s; {described}; "
          f"the loop's: {verdict}")  # shown with pytest -s: the measured figures behind the README's
    # the loop's numbers are the client's, up to the few requests at a window's edge or near an objective
    # (the probe stamps a token inside the step, the client sees it when the step returns)
    for limit, n_key, met_key in ((current, "current_n", "current_met"), (candidate, "candidate_n", "candidate_met")):
        n = len(by_limit[limit])
        assert abs(verdict[n_key] - n) <= max(3, 0.15 * n), (verdict, described)
        assert abs(verdict[met_key] * verdict[n_key] - share[limit] * n) <= max(2, 0.15 * n), (verdict, described)
    assert min(verdict["current_n"], verdict["candidate_n"]) >= run.loop.min_requests
    return share, verdict


def test_a_smaller_batch_that_meets_a_strict_itl_objective_is_kept() -> None:
    run, stage = _trial(strict="itl")
    try:
        share, verdict = _check(run, stage, "kept")
        assert share[CANDIDATE] - share[MAX_NUM_SEQS] >= 0.5, share  # the truth, decisive on the client's clock
        low, high = verdict["interval_95"]
        assert verdict["verdict"] == "better" and 0 < low <= verdict["difference"] <= high
        # the engine took it: the request sent after the verdict arrived under the new limit
        assert run.engine.scheduler.max_num_seqs == CANDIDATE and run.seen[max(run.seen)].limit == CANDIDATE
        doc = run.agent.decisions_document(100)
        assert doc["in_force"]["max_num_seqs"] == CANDIDATE and doc["in_flight"]["max_num_seqs"] == 0
    finally:
        run.close()


def test_a_smaller_batch_that_makes_requests_queue_past_a_strict_ttft_objective_is_rolled_back() -> None:
    run, stage = _trial(strict="ttft")
    try:
        share, verdict = _check(run, stage, "rolled_back")
        # decisive on the client's clock (~35 requests an arm: 0.3 is ~3 standard errors); the configured limit's
        # share moves with how many of its window's requests waited (measured 50-79%, the candidate's 0-7%)
        assert share[MAX_NUM_SEQS] - share[CANDIDATE] >= 0.3, share
        assert verdict["verdict"] == "worse" and verdict["interval_95"][1] < 0
        assert run.engine.scheduler.max_num_seqs == MAX_NUM_SEQS and run.seen[max(run.seen)].limit == MAX_NUM_SEQS
        assert run.agent.decisions_document(100)["in_force"]["max_num_seqs"] == MAX_NUM_SEQS
    finally:
        run.close()
