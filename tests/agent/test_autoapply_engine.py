"""The closed loop on our engine (shipped tiny-moe with tiny-draft, CPU): the agent applies its
speculation advice through the control block behind a canary and keeps or rolls it back on the
measured A/B of the two arms; a task it disabled is re-checked and re-enabled when measured better.

Where the truth comes from. Whether the shipped draft helps a task on a given CPU is not assumed: with
the trained weights, creative's plain decode beats its speculative one here by ~15% (measured, 8 vs
9.4 ms/token unloaded), too little for the advice to become decisive in CI time (it took ~75
requests, 45-210 s), and no task's draft helps enough to be kept whatever the machine. So the test
builds both (first_conditions): a test-only observer sleeps CREATIVE_SPEC_DELAY_S inside every
speculative step that emits a `creative` token (its speculation made worse on purpose) and
CODE_PLAIN_DELAY_S inside every plain step that emits a `code` token (the plain arm of `code` pays
it, its speculative arm does not). Before the loop runs, the truth is measured independently, on
the client's clock (perf_counter around each engine step, no probe record read): plain decode must
be faster than speculative for `creative` and slower for `code`. Only then is the loop held to it:
`creative` disabled and kept, `code` left alone.

The re-check (story): RECHECK_S after the disable, the loop canaries speculation on again for half of
creative's requests; the conditions unchanged, the speculating arm is slower (on the client's clock)
and the loop leaves creative off. Then the conditions flip (flipped_conditions: creative's plain
steps pay CREATIVE_PLAIN_DELAY_S, its speculative ones nothing); RECHECK_S after the failed
re-check the next one finds the speculating arm faster and re-enables it.

The rollback: the same observer sleeps inside every step of a request in the canary's treatment arm,
so the change the advice asks for (plain `creative`) is made worse on purpose; the loop must measure
that and roll back. The inconclusive case (nothing decided while the interval holds 0) is
tests/agent/test_autoapply_state_machine.py's, on synthetic samples. Timings are wall-clock on a
shared 2-core machine: noisy; the effects built here are 2-4x, far outside that noise.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from statistics import median
from typing import Callable

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from testkit import one_torch_thread, unique_ring

from infersight.agent.autoapply.config import AutoApplyConfig
from infersight.agent.config import AgentConfig
from infersight.agent.service import Agent
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig, SamplingParams
from infersight.runtime.engine.run_policy import PolicyArm
from infersight.workload import WorkloadConfig, build_workload

MAX_TOKENS = 8
CODE_PLAIN_DELAY_S = 0.06
CREATIVE_SPEC_DELAY_S = 0.03
CREATIVE_PLAIN_DELAY_S = 0.06  # > the speculative step's extra compute even when load stretches it 5x
TREATMENT_DELAY_S = 0.08
RECHECK_S = 2.5
PROMPTS = {task: [r.prompt[-48:] for r in build_workload(WorkloadConfig(num_requests=64, seed=3)) if r.task == task][:6]
           for task in ("code", "creative")}


class DelayObserver(ProbeObserver):
    """Test-only: sleeps delay(observer, request ids) seconds inside each step (before its end is
    stamped: the step's records and the requests' later tokens carry it). `delay` may be swapped
    while the engine runs (the conditions flip)."""

    def __init__(self, config: ProbeConfig, delay: Callable[["DelayObserver", list[int]], float]) -> None:
        super().__init__(config)
        self.delay = delay
        self.task_of: dict[int, str | None] = {}
        self.arms: dict[int, int] = {}
        self.seqs: dict[int, int] = {}  # request id -> the policy generation it arrived under
        self.speculative_step = False

    def on_request_arrived(self, request_id, t_ns, num_prompt_tokens, task, trace_id) -> None:  # type: ignore[no-untyped-def]
        self.task_of[request_id] = task
        super().on_request_arrived(request_id, t_ns, num_prompt_tokens, task, trace_id)

    def on_policy_arm(self, request_id: int, t_ns: int, arm: int, policy_seq: int) -> None:
        self.arms[request_id], self.seqs[request_id] = arm, policy_seq
        super().on_policy_arm(request_id, t_ns, arm, policy_seq)

    def on_step_begin(self, step_id: int, t_ns: int) -> None:
        self.speculative_step = False
        super().on_step_begin(step_id, t_ns)

    def on_spec_verified(self, *args) -> None:  # type: ignore[no-untyped-def]
        self.speculative_step = True
        super().on_spec_verified(*args)

    def on_tokens_emitted_many(self, request_ids: list[int], t_ns: int, num_tokens: list[int]) -> None:
        super().on_tokens_emitted_many(request_ids, t_ns, num_tokens)
        seconds = self.delay(self, request_ids)
        if seconds:
            time.sleep(seconds)


def _has(obs: DelayObserver, rids: list[int], task: str) -> bool:
    return any(obs.task_of.get(r) == task for r in rids)


def first_conditions(obs: DelayObserver, rids: list[int]) -> float:
    """code's plain steps slow (speculation must stay), creative's speculative steps slow (it must go)."""
    if not obs.speculative_step:
        return CODE_PLAIN_DELAY_S if _has(obs, rids, "code") else 0.0
    return CREATIVE_SPEC_DELAY_S if _has(obs, rids, "creative") else 0.0


def flipped_conditions(obs: DelayObserver, rids: list[int]) -> float:
    """creative's plain steps slow now, its speculative ones not (code's as before)."""
    if obs.speculative_step:
        return 0.0
    return CODE_PLAIN_DELAY_S if _has(obs, rids, "code") else CREATIVE_PLAIN_DELAY_S if _has(obs, rids, "creative") \
        else 0.0


def treatment_arm(obs: DelayObserver, rids: list[int]) -> float:
    return TREATMENT_DELAY_S if any(obs.arms.get(r) == PolicyArm.TREATMENT for r in rids) else 0.0


class Run:
    """An engine with the delaying observer and an agent with the loop, driven one request at a time
    (batch 1: each request's steps are its own, so an arm's latency is that arm's)."""

    def __init__(self, delay: Callable[[DelayObserver, list[int]], float], recheck_s: float = 1800.0) -> None:
        ring = unique_ring("autoapply")
        self.probe = DelayObserver(ProbeConfig(ring_name=ring), delay)
        self.engine = Engine(EngineConfig(model="tiny-moe", speculative_model="tiny-draft", num_speculative_tokens=4,
                                          spec_probe_every=4, num_kv_blocks=64, block_size=16), self.probe)
        loop = AutoApplyConfig(knobs=("speculation",), control_share=0.5, min_window_s=2.0, max_window_s=120.0,
                               min_requests=5, cooldown_s=1.0, recheck_s=recheck_s)
        self.agent = Agent(AgentConfig(rings=[ring], port=0, auto_apply=loop))
        self.client_tpot: dict[int, float] = {}  # request id -> client-clock seconds per output token after the first

    def request(self, task: str, i: int, use_speculation: bool = True, poll: bool = True) -> int:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, task=task,
                                use_speculation=use_speculation)
        rid = self.engine.add_request(PROMPTS[task][i % len(PROMPTS[task])], params)
        seen, first, last = 0, None, None
        while self.engine.has_unfinished():
            self.engine.step()
            now = time.perf_counter()
            n = len(self.engine.requests[rid].output_token_ids)
            if n > seen:
                first, last, seen = first if first is not None else now, now, n
        # The agent reads the ring between requests, not between steps: in one thread a poll inside a
        # request would land in its inter-token times (a separate agent process does not).
        if poll:
            self.agent.poll_once()
        self.client_tpot[rid] = (last - first) / (seen - 1)
        return rid

    def decisions(self, task: str) -> list:
        return [d for d in self.agent.autoapply.decisions if d.target == task]

    def stages(self, task: str) -> list[str]:
        return [d.stage for d in self.decisions(task)]

    def drive(self, tasks: tuple[str, ...], verdicts: int, deadline: float) -> None:
        """Requests of `tasks` in turn until creative has had `verdicts` verdicts (kept or rolled back)."""
        i = 0
        while sum(s in ("kept", "rolled_back") for s in self.stages("creative")) < verdicts \
                and time.monotonic() < deadline:
            self.request(tasks[i % len(tasks)], i)
            i += 1

    def client_arms(self, canary_seq: int) -> dict[bool, list[float]]:
        """speculated or not -> the client-clock time per token of creative's requests under a canary
        (the engine's own record of what each request did)."""
        out: dict[bool, list[float]] = {True: [], False: []}
        for rid, seq in self.probe.seqs.items():
            if seq == canary_seq and self.probe.task_of[rid] == "creative" and rid in self.client_tpot:
                out[self.engine.requests[rid].params.use_speculation].append(self.client_tpot[rid])
        return out

    def close(self) -> None:
        self.agent.close()
        self.probe.close()


def _truth(run: Run, task: str) -> tuple[float, float]:
    """(plain, speculative) median client-clock time per output token of three requests each. The
    agent does not poll meanwhile: its loop could start a canary, and a request drawn into its
    treatment arm would not speculate (the policy overrides the request's own flag; once, in a full
    suite, two of creative's three "speculative" requests ran plain). Each one's kind is checked."""
    plain_ids = [run.request(task, i, use_speculation=False, poll=False) for i in range(3)]
    spec_ids = [run.request(task, i, poll=False) for i in range(3)]
    assert all(run.engine.requests[r].num_spec_proposed == 0 for r in plain_ids)
    assert all(run.engine.requests[r].num_spec_proposed > 0 for r in spec_ids), task
    return median(run.client_tpot[r] for r in plain_ids), median(run.client_tpot[r] for r in spec_ids)


@dataclass
class Disabled:
    """What the agent said when creative's disable was kept (before any re-check)."""

    decisions: list
    document: dict
    metrics: str


@pytest.fixture(scope="module")
def story():
    """creative disabled (first conditions), a re-check that finds no gain, the conditions flipped,
    a re-check that re-enables it."""
    run = Run(first_conditions, recheck_s=RECHECK_S)
    try:
        with one_torch_thread():
            truth = {task: _truth(run, task) for task in ("code", "creative")}
            deadline = time.monotonic() + 300  # generous: a loaded CI machine runs fewer requests a minute
            run.drive(("creative", "creative", "code"), 1, deadline)
            disabled = Disabled(list(run.agent.autoapply.decisions), run.agent.decisions_document(100),
                                generate_latest(run.agent.registry).decode())
            run.drive(("creative",), 2, deadline)  # RECHECK_S later: the first re-check
            run.probe.delay = flipped_conditions
            run.drive(("creative",), 3, deadline)  # RECHECK_S after it failed: the second
            final = run.request("creative", 0)
        yield run, truth, disabled, final
    finally:
        run.close()


def test_the_truth_measured_on_the_clients_clock(story) -> None:
    _, truth, _, _ = story
    plain, spec = truth["creative"]
    assert plain < spec, f"creative: plain {plain * 1e3:.1f} ms/token should beat speculative {spec * 1e3:.1f}"
    plain, spec = truth["code"]
    assert spec < plain, f"code: speculative {spec * 1e3:.1f} ms/token should beat plain {plain * 1e3:.1f}"


def test_speculation_is_disabled_for_creative_and_kept_for_code(story) -> None:
    run, _, disabled, _ = story
    assert [d.stage for d in disabled.decisions] == ["proposed", "canaried", "kept"]
    assert {d.target for d in disabled.decisions} == {"creative"} and run.stages("code") == []  # code: keep
    kept = disabled.decisions[-1]
    assert kept.before is True and kept.after is False and kept.numbers["verdict"] == "better"
    assert kept.numbers["interval_95_s"][1] < 0 and min(kept.numbers["control_n"], kept.numbers["treatment_n"]) >= 5
    # the engine took it: every creative request that arrived under it is in its treatment arm (none
    # left in control) and did not speculate; code ones still do
    under = [rid for rid, seq in run.probe.seqs.items()
             if seq == kept.policy_seq and run.probe.task_of[rid] == "creative"]
    assert len(under) >= 2 and {run.probe.arms[rid] for rid in under} == {PolicyArm.TREATMENT}
    assert not any(run.engine.requests[rid].params.use_speculation for rid in under)
    assert all(run.engine.requests[rid].num_spec_proposed == 0 for rid in under)
    assert run.engine.requests[run.request("code", 0)].num_spec_proposed > 0


def test_each_arm_is_in_the_probe_records_and_the_clients_clock_agrees(story) -> None:
    run, _, _, _ = story
    canary = next(d for d in run.agent.autoapply.decisions if d.stage == "canaried")
    samples = run.agent.autoapply.samples.frame()
    arms = samples[(samples["seq"] == canary.policy_seq) & (samples["task"] == "creative")]
    assert len(arms) >= 10
    by_arm: dict[int, list[float]] = {int(PolicyArm.CONTROL): [], int(PolicyArm.TREATMENT): []}
    for rid, arm in zip(arms["request_id"], arms["arm"]):
        req = run.engine.requests[int(rid)]
        # the record's arm is the engine's own: control keeps speculating, treatment does not
        assert req.params.use_speculation == (arm == PolicyArm.CONTROL)
        by_arm[int(arm)].append(run.client_tpot[int(rid)])
    assert median(by_arm[int(PolicyArm.TREATMENT)]) < median(by_arm[int(PolicyArm.CONTROL)])


def test_every_decision_is_in_the_api_and_a_metric(story) -> None:
    run, _, disabled, _ = story
    doc = disabled.document
    assert doc["auto_apply"] == "on" and doc["engine_takes_policy"] is True and doc["recheck_s"] == RECHECK_S
    assert [(d["target"], d["stage"]) for d in doc["decisions"]] == [("creative", s) for s in
                                                                      ("proposed", "canaried", "kept")]
    assert doc["in_force"]["speculation"] == {"creative": False} and doc["in_flight"]["speculation"] == 0
    fams = {f.name: f for f in text_string_to_metric_families(disabled.metrics)}
    counts = {(s.labels["knob"], s.labels["stage"]): s.value for s in fams["infersight_autoapply_decisions"].samples
              if s.name.endswith("_total")}
    assert counts[("speculation", "kept")] == 1 and counts[("speculation", "rolled_back")] == 0
    assert {s.labels["task"]: s.value for s in fams["infersight_autoapply_speculation_enabled"].samples} == \
        {"creative": 0.0}


def _recheck(run: Run, first: int) -> tuple[list, dict[bool, list[float]]]:
    """creative's decisions first..first+3 (a re-check) and its arms on the client's clock."""
    proposed, canaried, verdict = run.decisions("creative")[first:first + 3]
    assert (proposed.stage, canaried.stage) == ("proposed", "canaried")
    assert proposed.numbers["trigger"] == "recheck" and (proposed.before, proposed.after) == (False, True)
    # it waited the full interval since creative's speculation last went off (the decision before)
    assert proposed.wall_time - run.decisions("creative")[first - 1].wall_time >= RECHECK_S
    assert proposed.numbers["off_for_s"] >= RECHECK_S
    arms = run.client_arms(canaried.policy_seq)
    assert min(len(arms[True]), len(arms[False])) >= 5
    # The loop's medians are the client's, up to where each clock stands: the probe stamps a step's
    # tokens before the observer's sleep, the client sees them after the step, so a request whose first
    # and last steps sleep differently is one sleep (over its MAX_TOKENS - 1 intervals) apart.
    v = verdict.numbers
    one_sleep = max(CREATIVE_SPEC_DELAY_S, CREATIVE_PLAIN_DELAY_S) / (MAX_TOKENS - 1)
    for arm, key in ((True, "treatment_median_s"), (False, "control_median_s")):
        assert abs(v[key] - median(arms[arm])) <= 0.2 * median(arms[arm]) + one_sleep + 0.002, (v, arms)
    return [proposed, canaried, verdict], arms


def test_a_recheck_that_finds_no_gain_leaves_it_disabled(story) -> None:
    run, _, _, _ = story
    (_, _, verdict), arms = _recheck(run, 3)
    assert median(arms[True]) > median(arms[False])  # the truth: speculating is still slower
    assert (verdict.stage, verdict.numbers["verdict"]) == ("rolled_back", "worse")
    assert verdict.numbers["interval_95_s"][0] > 0
    under = [rid for rid, seq in run.probe.seqs.items() if seq == verdict.policy_seq]
    assert under and not any(run.engine.requests[rid].params.use_speculation for rid in under)  # off again


def test_a_recheck_re_enables_speculation_when_it_measures_better(story) -> None:
    run, _, _, final = story
    (_, _, verdict), arms = _recheck(run, 6)
    assert median(arms[True]) < median(arms[False])  # the truth after the flip: speculating is faster
    assert (verdict.stage, verdict.after, verdict.numbers["verdict"]) == ("kept", True, "better")
    assert verdict.numbers["interval_95_s"][1] < 0
    assert run.stages("creative") == ["proposed", "canaried", "kept", "proposed", "canaried", "rolled_back",
                                      "proposed", "canaried", "kept"]
    (policy,) = run.engine.policy.tasks
    assert (policy.label, policy.speculate, policy.control_share) == ("creative", True, 0.0)
    assert run.engine.requests[final].num_spec_proposed > 0 and run.probe.seqs[final] == verdict.policy_seq
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(run.agent.registry).decode())}
    counts = {(s.labels["knob"], s.labels["stage"]): s.value for s in fams["infersight_autoapply_decisions"].samples
              if s.name.endswith("_total")}
    assert (counts[("speculation", "proposed")], counts[("speculation", "kept")],
            counts[("speculation", "rolled_back")]) == (3, 2, 1)
    assert {s.labels["task"]: s.value for s in fams["infersight_autoapply_speculation_enabled"].samples} == \
        {"creative": 1.0}


def test_a_change_made_worse_on_purpose_is_rolled_back() -> None:
    run = Run(treatment_arm)
    try:
        with one_torch_thread():
            i, deadline = 0, time.monotonic() + 120
            while not {"kept", "rolled_back"} & set(run.stages("creative")) and time.monotonic() < deadline:
                run.request("creative", i)
                i += 1
            later = run.request("creative", 0)
        assert run.stages("creative") == ["proposed", "canaried", "rolled_back"]
        last = list(run.agent.autoapply.decisions)[-1]
        assert last.numbers["verdict"] == "worse" and last.numbers["interval_95_s"][0] > 0
        assert run.engine.policy.tasks == ()  # the engine's default again: creative speculates
        assert run.engine.requests[later].params.use_speculation and run.probe.arms.get(later) == PolicyArm.NONE
        treated = [r for r, a in run.probe.arms.items() if a == PolicyArm.TREATMENT]
        control = [r for r, a in run.probe.arms.items() if a == PolicyArm.CONTROL]
        assert median(run.client_tpot[r] for r in treated) > median(run.client_tpot[r] for r in control)
    finally:
        run.close()


def test_the_mcp_decisions_tool_is_the_agents_document(story) -> None:
    """The SDK's own client over stdio (spawning `infersight mcp`) against the agent's API."""
    import asyncio
    import json
    import os
    import sys
    import urllib.request
    from pathlib import Path

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    run, _, _, _ = story
    run.agent.start_http()
    url = f"http://127.0.0.1:{run.agent.port}"
    with urllib.request.urlopen(f"{url}/api/v1/decisions?limit=100", timeout=10) as answer:
        api = json.loads(answer.read())
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    params = StdioServerParameters(command=sys.executable, args=["-m", "infersight", "mcp", "--agent", url], env=env,
                                   cwd=str(repo))

    async def call() -> tuple:
        async with Client(params, read_timeout_seconds=120) as client:
            good = await client.call_tool("decisions", {"limit": 100})
            bad = await client.call_tool("decisions", {"limit": -1})
            return good, bad

    good, bad = asyncio.run(call())
    assert not good.is_error and bad.is_error
    got = good.structured_content
    assert got["decisions"] == api["decisions"] and got["in_force"] == api["in_force"]
    assert [d["stage"] for d in got["decisions"]] == run.stages("creative") and len(got["decisions"]) == 9
    assert "measured" in got["provenance"]["kept/rolled_back.numbers"]
