"""Energy per request against a known answer: a fake GPU whose only power is the engine's token work.

The real tiny engine runs with its model runner wrapped: before each forward, every request in it
adds WATTS x PREFILL_S joules per prefill token and WATTS x DECODE_S per decode token to the fake
GPU's energy counter, and the forward takes that long (one sleep), so the engine's step timings
carry the cost as a GPU's would. Each request's true energy is known in advance, without the
agent; the agent sees only what it would see on a GPU: the engine's probe ring and the counter
(and a power gauge reading WATTS), read every READ_EVERY steps.

Two classes run alone, then mixed: long prompts with two output tokens, and short prompts with
many. Alone, a class's joules per request are the counter's rise over its phase divided by its
requests (no split at all). Mixed, the agent's split must give each class those joules within
CLASS_TOLERANCE, and each request its true joules within its own printed sampling bound plus
REQUEST_MODEL_ERROR. Token share, computed here from the engine's own step records, would miss the
classes by far more: the check bites. What remains is the energy model's error (its fit sees the
counter only at the readings) and the sampling error between readings: inside an interval the
counter is interpolated by time, and host work (a loaded CPU's) takes time but no energy here.

The counter is read every READ_EVERY steps: on a GPU it is read every 0.1-1 s, tens of steps, over
minutes, so the fit has long been usable; this run is seconds long, and its fit needs four intervals
before the mixed phase (correlate.token_cost.MIN_FIT_INTERVALS).
"""
from __future__ import annotations

import random
import sys
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import pytest
from agent_workload import TINY, one_torch_thread, unique_ring

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from gpu_fakes import FakeGpuState, FakeNvml  # noqa: E402

from infersight.agent.config import AgentConfig  # noqa: E402
from infersight.agent.service import Agent  # noqa: E402
from infersight.gpu.nvml_collector import NvmlCollector  # noqa: E402
from infersight.probes.config import ProbeConfig  # noqa: E402
from infersight.probes.observer import ProbeObserver  # noqa: E402
from infersight.runtime import Engine, EngineConfig, SamplingParams, StepStats  # noqa: E402

WATTS = 400
PREFILL_S, DECODE_S = 0.0005, 0.01  # a decode token costs 20 prefill tokens, as on a GPU's memory-bound decode
READ_EVERY = 2  # engine steps between two readings of the counter (see the module docstring)
#: (prompt bytes, max_tokens): the classes. Prompts are unique per request (no prefix-cache hits).
CLASSES = {"long_prompt": (90, 2), "long_output": (5, 12)}
PER_CLASS = 6
#: Stated errors: each class's mean joules per request in the mixed run against its alone figure,
#: and each request's joules against its truth beyond the sampling bound the agent printed for it
#: (relative). Token share must miss a class by more than TOKEN_SHARE_MISS. Seen on 2 CPU cores loaded
#: by a package install (5 runs): classes within 7 %, every request's truth inside its bound
#: (requests off by up to 46 %, their bounds 12-84 %), token share off by 33-101 %; the rest is margin.
CLASS_TOLERANCE = 0.15
REQUEST_MODEL_ERROR = 0.10
TOKEN_SHARE_MISS = 0.25


@dataclass
class TokenPoweredGpu:
    """The fake GPU: its counter (FakeGpuState.energy_mj) rises by a known amount per token the
    engine feeds, and by nothing else; the step takes that work's time (a sleep), so the engine's
    step timings carry the cost, as a GPU's would."""

    state: FakeGpuState
    truth_uj: dict[int, int] = field(default_factory=dict)  # request id -> its true energy
    total_uj: int = 0

    def wrap(self, engine: Engine) -> None:
        """Each forward first computes its requests' tokens (one sleep for them all), then runs."""
        run = engine.target.run
        base_mj = self.state.energy_mj

        def powered(items, *args, **kwargs):  # type: ignore[no-untyped-def]
            seconds = 0.0
            for item in items:
                prefilling = item.req.in_prefill or not item.req.output_token_ids  # the engine's own rule
                s = PREFILL_S * len(item.tokens) if prefilling else DECODE_S
                uj = round(WATTS * s * 1e6)
                self.truth_uj[item.req.request_id] = self.truth_uj.get(item.req.request_id, 0) + uj
                self.total_uj += uj
                seconds += s
            time.sleep(seconds)
            self.state.energy_mj = base_mj + self.total_uj // 1000
            return run(items, *args, **kwargs)

        engine.target.run = powered  # type: ignore[method-assign]


@dataclass
class Phase:
    name: str
    request_ids: list[int]
    counter_uj: int  # the fake's energy over the phase


@dataclass
class Run:
    gpu: TokenPoweredGpu
    agent: Agent
    phases: list[Phase]
    tasks: dict[int, str]
    steps: list[StepStats]
    readings: list[tuple[int, int]]  # (ts_ns, uJ) the agent's sampler took


def _prompt(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))


@pytest.fixture(scope="module")
def run() -> Run:
    ring = unique_ring("energy-known")
    probe = ProbeObserver(ProbeConfig(ring_name=ring, ring_capacity=1 << 16, nvtx=False))
    engine = Engine(EngineConfig(model=TINY, num_kv_blocks=512, block_size=8), probe)
    gpu = TokenPoweredGpu(FakeGpuState(uuid="GPU-fake-0", energy_mj=9_000_000, power_mw=WATTS * 1000))
    gpu.wrap(engine)
    agent = Agent(AgentConfig(rings=[ring], port=0), gpu_collector=NvmlCollector(FakeNvml([gpu.state]), gpm=False))
    rng, tasks, steps, phases = random.Random(0), {}, [], []
    done = threading.Event()

    def poll_agent() -> None:  # beside the engine, as the agent's own process would be
        while not done.is_set():
            agent.poll_once()
            done.wait(0.2)

    def add(task: str, n: int) -> list[int]:
        length, max_tokens = CLASSES[task]
        ids = [engine.add_request(_prompt(rng, length), SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                      ignore_eos=True, task=task)) for _ in range(n)]
        tasks.update({rid: task for rid in ids})
        return ids

    def step(times: int | None = None) -> None:
        k = 0
        while engine.has_unfinished() and (times is None or k < times):
            steps.append(engine.step())
            k += 1
            if len(steps) % READ_EVERY == 0:
                agent.gpu.poll_once()

    def phase(name: str, body) -> None:  # type: ignore[no-untyped-def]
        before = gpu.total_uj
        ids = body()
        phases.append(Phase(name, ids, gpu.total_uj - before))

    poller = threading.Thread(target=poll_agent, daemon=True)
    try:
        with one_torch_thread():
            agent.gpu.poll_once()  # the account starts before the first step
            poller.start()
            for task in CLASSES:
                phase(task, lambda task=task: (ids := add(task, PER_CLASS), step(), ids)[2])

            def mixed() -> list[int]:
                # Short prompts decode while the long ones arrive one by one: each long prompt's
                # prefill shares a step with every short one's decode.
                ids = add("long_output", PER_CLASS)
                step(2)
                for _ in range(PER_CLASS):
                    ids += add("long_prompt", 1)
                    step(1)
                step()
                return ids

            phase("mixed", mixed)
        agent.gpu.poll_once()  # a reading after the last step: the last rows need not wait for one
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(agent.state.finished) < len(tasks):
            time.sleep(0.02)
    finally:
        done.set()
        poller.join()
        agent.close()
        probe.close()
    readings = [(s.ts_ns, round(s.value * 1e6)) for s in agent.gpu.recent() if s.field == "energy_joules"]
    return Run(gpu, agent, phases, tasks, steps, readings)


def _rows(run: Run) -> dict[int, dict]:
    return {int(r["request_id"]): r for r in run.agent.state.finished}


def _token_share_uj(run: Run) -> dict[int, Fraction]:
    """Each step's energy (linear between the readings, as any split must start from) by token share,
    from the engine's own StepStats: what the agent gave before it weighed tokens by their cost."""
    readings = run.readings

    def counter(t: int) -> Fraction:
        for (t0, e0), (t1, e1) in zip(readings, readings[1:]):
            if t0 <= t <= t1:
                return e0 + Fraction(e1 - e0) * (t - t0) / (t1 - t0)
        raise AssertionError(f"{t} is outside the readings")

    out: dict[int, Fraction] = {}
    for st in run.steps:
        amount, total = counter(st.end_ns) - counter(st.start_ns), sum(n for _, n in st.batch)
        for rid, n in st.batch:
            out[rid] = out.get(rid, Fraction(0)) + amount * n / total
    return out


def _mixed_by_class(run: Run, joules: dict[int, float]) -> dict[str, float]:
    mixed = run.phases[-1].request_ids
    return {task: sum(joules[r] for r in mixed if run.tasks[r] == task) / PER_CLASS for task in CLASSES}


def test_every_request_finished_with_a_measured_split(run: Run) -> None:
    rows = _rows(run)
    assert sorted(rows) == sorted(run.tasks)
    assert all(r["energy_j"] == r["energy_j"] and r["energy_sampling_bound_j"] >= 0 for r in rows.values())
    # The bound says something: nonzero somewhere, and below the request's own joules.
    assert 0 < sum(r["energy_sampling_bound_j"] for r in rows.values()) < sum(r["energy_j"] for r in rows.values())
    meter = run.agent.state.energy
    assert meter.costs.usable and meter.steps_by_model > meter.steps_by_tokens
    # The engine's work drove the counter: every joule the fake GPU drew is some request's.
    assert sum(run.gpu.truth_uj.values()) == run.gpu.total_uj > 0


def test_mixed_attribution_matches_each_class_alone(run: Run) -> None:
    alone = {p.name: float(p.counter_uj) / 1e6 / PER_CLASS for p in run.phases[:2]}
    agent = _mixed_by_class(run, {rid: r["energy_j"] for rid, r in _rows(run).items()})
    token_share = _mixed_by_class(run, {rid: float(uj) / 1e6 for rid, uj in _token_share_uj(run).items()})
    for task in CLASSES:
        assert agent[task] == pytest.approx(alone[task], rel=CLASS_TOLERANCE), (task, agent, alone)
        assert abs(token_share[task] / alone[task] - 1) > TOKEN_SHARE_MISS, (task, token_share, alone)


def test_each_request_gets_its_true_joules_within_its_printed_bound(run: Run) -> None:
    rows = _rows(run)
    for rid in run.phases[-1].request_ids:
        truth = float(run.gpu.truth_uj[rid]) / 1e6
        row = rows[rid]
        assert abs(row["energy_j"] - truth) <= row["energy_sampling_bound_j"] + REQUEST_MODEL_ERROR * truth, (
            rid, run.tasks[rid], row["energy_j"], truth, row["energy_sampling_bound_j"])


def test_the_fitted_joules_per_token_are_the_fake_gpus(run: Run) -> None:
    costs = run.agent.state.energy.costs
    assert costs.usable
    assert costs.prefill_uj == pytest.approx(WATTS * PREFILL_S * 1e6, rel=CLASS_TOLERANCE)
    assert costs.decode_uj == pytest.approx(WATTS * DECODE_S * 1e6, rel=CLASS_TOLERANCE)
