"""Energy per request against a known answer: a fake GPU whose power is the engine's token work plus
a known static draw.

The real tiny engine runs with its model runner wrapped: before each forward, every request in it
adds WATTS x PREFILL_S joules per prefill token and WATTS x DECODE_S per decode token to the fake
GPU's energy counter, and the forward takes that long (one sleep), so the engine's step timings
carry the cost as a GPU's would (plus HOST_S of host work per forward). On top, the counter rises
by STATIC_W x wall time, all the time (a GPU's static draw: idle, host work, the sleep's overshoot
on a loaded machine, all of it). Each request's true DYNAMIC energy (its tokens' joules) is known
in advance, without the agent; the agent sees only what it would see on a GPU: the engine's probe
ring and the counter (and a power gauge reading WATTS + STATIC_W), read every READ_EVERY steps.

Two classes run alone, then mixed: long prompts with two output tokens, and short prompts with
many. Alone, a class's DYNAMIC joules per request are the counter's rise over its phase less
STATIC_W x the phase's wall time, divided by its requests (no split at all, the fake's constants
only). Its total joules alone (the counter's rise / requests) are not a property of the request:
static energy accrues for as long as the phase takes, and how long that is depends on the host's
load and on what else is batched (on the H200, long prompts ran 1.5x faster mixed than alone).
So the known answer is dynamic: mixed, the agent's energy_dynamic_j must give each class its alone
figure within CLASS_TOLERANCE, each request its true dynamic joules within its printed sampling
bound plus REQUEST_MODEL_ERROR, and the fit must find STATIC_W and the joules per token. The
static part, summed over the requests, must be STATIC_W x the time of the steps they ran in (the
engine's own step records). Token share of the same dynamic energy would miss the classes by far
more: the check bites.

The counter is read every READ_EVERY steps: on a GPU it is read every 0.1-1 s, tens of steps, over
minutes, so the fit has long been usable; this run is seconds long, so each class runs alone twice
(a fit of three regressors needs six intervals before the mixed phase, correlate.token_cost), and
the alone figure is their mean.
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
from infersight.agent.energy_summary import describe_energy  # noqa: E402
from infersight.agent.gpu_config import GpuConfig  # noqa: E402
from infersight.agent.service import Agent  # noqa: E402
from infersight.gpu.nvml_collector import NvmlCollector  # noqa: E402
from infersight.probes.config import ProbeConfig  # noqa: E402
from infersight.probes.observer import ProbeObserver  # noqa: E402
from infersight.runtime import Engine, EngineConfig, SamplingParams, StepStats  # noqa: E402

WATTS = 400
PREFILL_S, DECODE_S = 0.0005, 0.01  # a decode token costs 20 prefill tokens, as on a GPU's memory-bound decode
STATIC_W = 50  # the fake's static draw, on the wall clock
#: Each forward's host work (launches, sampling), beside its tokens' time: it draws static power only.
#: Step time that does not follow the tokens is what tells static power from token work; the host's
#: own jitter gives some, this gives a floor that a loaded machine's noise does not swamp.
HOST_S = 0.005
READ_EVERY = 2  # engine steps between two readings of the counter (see the module docstring)
#: (prompt bytes, max_tokens): the classes. Prompts are unique per request (no prefix-cache hits).
CLASSES = {"long_prompt": (90, 2), "long_output": (5, 12)}
PER_CLASS = 6
ALONE_RUNS = 2  # each class alone, this many times, before the mixed phase
#: Stated errors: each class's mean dynamic joules per request in the mixed run against its alone
#: figure; the fitted joules per token against the fake's; each request's dynamic joules against its
#: truth beyond the sampling bound the agent printed for it (relative). STATIC_TOLERANCE: the fitted
#: static watts, and the requests' static joules against STATIC_W x their steps' time. The static term
#: is the weakest-determined of the fit: step time is mostly token time here, and the gaps between
#: steps (static power only) are charged the interval's mean power by the interpolation, which on a
#: loaded host pushes static up and joules per token down. Token share must miss a class by more than
#: TOKEN_SHARE_MISS. Seen on 2 CPU cores at load 9-27 (7 runs): static 39-64 W, static joules -18 to
#: +32%, classes -9.1 to +6.1%, J/token -9 to +6%; the rest is margin.
CLASS_TOLERANCE = 0.15
STATIC_TOLERANCE = 0.50
REQUEST_MODEL_ERROR = 0.10
TOKEN_SHARE_MISS = 0.25


@dataclass
class TokenPoweredGpu:
    """The fake GPU's truth: the token work so far (and each request's), and the static draw since
    t0_ns. Its counter is BASE_UJ + token work + STATIC_W x (now - t0_ns)."""

    truth_uj: dict[int, int] = field(default_factory=dict)  # request id -> its true dynamic energy
    total_uj: int = 0  # dynamic energy so far
    t0_ns: int = field(default_factory=time.monotonic_ns)

    BASE_UJ = 9_000_000_000_000

    def counter_uj(self, now_ns: int) -> int:
        return self.BASE_UJ + self.total_uj + STATIC_W * (now_ns - self.t0_ns) // 1000  # W x ns = nJ

    def wrap(self, engine: Engine) -> None:
        """Each forward first computes its requests' tokens (one sleep for them all), then runs."""
        run = engine.target.run

        def powered(items, *args, **kwargs):  # type: ignore[no-untyped-def]
            seconds = 0.0
            for item in items:
                prefilling = item.req.in_prefill or not item.req.output_token_ids  # the engine's own rule
                s = PREFILL_S * len(item.tokens) if prefilling else DECODE_S
                uj = round(WATTS * s * 1e6)
                self.truth_uj[item.req.request_id] = self.truth_uj.get(item.req.request_id, 0) + uj
                self.total_uj += uj
                seconds += s
            time.sleep(seconds + HOST_S)
            return run(items, *args, **kwargs)

        engine.target.run = powered  # type: ignore[method-assign]


class PoweredState(FakeGpuState):
    """What the fake pynvml reads: the energy counter (mJ) of a TokenPoweredGpu, at the time it is read."""

    def __init__(self, gpu: TokenPoweredGpu, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.gpu = gpu

    @property  # type: ignore[override]
    def energy_mj(self) -> int:
        return self.gpu.counter_uj(time.monotonic_ns()) // 1000

    @energy_mj.setter
    def energy_mj(self, _: int) -> None:  # the dataclass's __init__ sets it; the counter is the truth's
        pass


@dataclass
class Phase:
    name: str
    request_ids: list[int]
    dynamic_uj: int  # the fake's token work over the phase
    counter_uj: int  # the fake's counter over the phase: token work + STATIC_W x seconds
    seconds: float


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
    gpu = TokenPoweredGpu()
    gpu.wrap(engine)
    state = PoweredState(gpu, uuid="GPU-fake-0", power_mw=(WATTS + STATIC_W) * 1000)
    # The fake counter moves with the work (no lag) and is read every READ_EVERY steps, ms apart: its
    # intervals enter the fit as they are (a real GPU's shorter than 0.9 s are merged: token_cost).
    agent = Agent(AgentConfig(rings=[ring], port=0, gpu=GpuConfig(energy_fit_min_s=0.0)),
                  gpu_collector=NvmlCollector(FakeNvml([state]), gpm=False))
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
        t0, dynamic0 = time.monotonic_ns(), gpu.total_uj
        counter0 = gpu.counter_uj(t0)
        ids = body()
        t1 = time.monotonic_ns()
        phases.append(Phase(name, ids, gpu.total_uj - dynamic0, gpu.counter_uj(t1) - counter0, (t1 - t0) / 1e9))

    poller = threading.Thread(target=poll_agent, daemon=True)
    try:
        with one_torch_thread():
            agent.gpu.poll_once()  # the account starts before the first step
            poller.start()
            for _ in range(ALONE_RUNS):
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


def _mixed(run: Run) -> Phase:
    return run.phases[-1]


def _alone_dynamic_j(run: Run) -> dict[str, float]:
    """Each class's dynamic joules per request alone: the counter's rise over its phases less
    STATIC_W x their seconds, per request (the fake's constants, no split), over its ALONE_RUNS."""
    out = {}
    for task in CLASSES:
        alone = [p for p in run.phases[:-1] if p.name == task]
        assert len(alone) == ALONE_RUNS
        rise_uj = sum(p.counter_uj for p in alone) - STATIC_W * 1e6 * sum(p.seconds for p in alone)
        out[task] = rise_uj / 1e6 / (PER_CLASS * ALONE_RUNS)
    return out


def _token_share_dynamic_uj(run: Run) -> dict[int, Fraction]:
    """Each step's dynamic energy (its energy linear between the readings, as any split must start
    from, less the fake's STATIC_W x its time) by token share, from the engine's own StepStats: what
    the agent gave before it weighed tokens by their cost."""
    readings = run.readings

    def counter(t: int) -> Fraction:
        for (t0, e0), (t1, e1) in zip(readings, readings[1:]):
            if t0 <= t <= t1:
                return e0 + Fraction(e1 - e0) * (t - t0) / (t1 - t0)
        raise AssertionError(f"{t} is outside the readings")

    out: dict[int, Fraction] = {}
    for st in run.steps:
        amount = counter(st.end_ns) - counter(st.start_ns) - Fraction(STATIC_W * (st.end_ns - st.start_ns), 1000)
        total = sum(n for _, n in st.batch)
        for rid, n in st.batch:
            out[rid] = out.get(rid, Fraction(0)) + amount * n / total
    return out


def _mixed_by_class(run: Run, joules: dict[int, float]) -> dict[str, float]:
    mixed = _mixed(run).request_ids
    return {task: sum(joules[r] for r in mixed if run.tasks[r] == task) / PER_CLASS for task in CLASSES}


def test_every_request_finished_with_a_measured_split(run: Run) -> None:
    rows = _rows(run)
    assert sorted(rows) == sorted(run.tasks)
    assert all(r["energy_j"] == r["energy_j"] and r["energy_sampling_bound_j"] >= 0 for r in rows.values())
    # The bound says something: nonzero somewhere, and below the request's own joules.
    assert 0 < sum(r["energy_sampling_bound_j"] for r in rows.values()) < sum(r["energy_j"] for r in rows.values())
    meter = run.agent.state.energy
    assert meter.costs.usable and meter.steps_by_model > meter.steps_by_tokens
    # The engine's work drove the dynamic part: every token joule the fake GPU drew is some request's.
    assert sum(run.gpu.truth_uj.values()) == run.gpu.total_uj > 0
    # The fake's alone figures are what its constants say: the counter less static is the token work.
    for p in run.phases:
        assert p.counter_uj - STATIC_W * 1e6 * p.seconds == pytest.approx(p.dynamic_uj, abs=2)
    # Every mixed request was split with a usable fit: cut into dynamic + static.
    for rid in _mixed(run).request_ids:
        r = rows[rid]
        assert r["energy_dynamic_j"] >= 0 and r["energy_static_j"] >= 0
        assert round(r["energy_dynamic_j"] * 1e6) + round(r["energy_static_j"] * 1e6) == round(r["energy_j"] * 1e6)


def test_mixed_dynamic_attribution_matches_each_class_alone(run: Run) -> None:
    alone = _alone_dynamic_j(run)
    agent = _mixed_by_class(run, {rid: r["energy_dynamic_j"] for rid, r in _rows(run).items()})
    token_share = _mixed_by_class(run, {rid: float(uj) / 1e6 for rid, uj in _token_share_dynamic_uj(run).items()})
    for task in CLASSES:
        assert agent[task] == pytest.approx(alone[task], rel=CLASS_TOLERANCE), (task, agent, alone)
        assert abs(token_share[task] / alone[task] - 1) > TOKEN_SHARE_MISS, (task, token_share, alone)


def test_each_request_gets_its_true_dynamic_joules_within_its_printed_bound(run: Run) -> None:
    rows = _rows(run)
    for rid in _mixed(run).request_ids:
        truth = float(run.gpu.truth_uj[rid]) / 1e6
        row = rows[rid]
        assert abs(row["energy_dynamic_j"] - truth) <= row["energy_sampling_bound_j"] + REQUEST_MODEL_ERROR * truth, (
            rid, run.tasks[rid], row["energy_dynamic_j"], truth, row["energy_sampling_bound_j"])


def test_the_requests_static_joules_are_the_static_draw_over_their_steps(run: Run) -> None:
    """The mixed phase's steps ran its requests alone (the phases drain): the fake drew STATIC_W over
    each of them, by the engine's own step records."""
    mixed = set(_mixed(run).request_ids)
    steps_s = sum((st.end_ns - st.start_ns) / 1e9 for st in run.steps if st.batch and {r for r, _ in st.batch} <= mixed)
    static_j = sum(r["energy_static_j"] for rid, r in _rows(run).items() if rid in mixed)
    assert static_j == pytest.approx(STATIC_W * steps_s, rel=STATIC_TOLERANCE), (static_j, STATIC_W * steps_s)


def test_the_fitted_static_watts_and_joules_per_token_are_the_fake_gpus(run: Run) -> None:
    costs = run.agent.state.energy.costs
    assert costs.usable
    assert costs.static_w == pytest.approx(STATIC_W, rel=STATIC_TOLERANCE)
    assert costs.prefill_uj == pytest.approx(WATTS * PREFILL_S * 1e6, rel=CLASS_TOLERANCE)
    assert costs.decode_uj == pytest.approx(WATTS * DECODE_S * 1e6, rel=CLASS_TOLERANCE)
    described = describe_energy(run.agent.state.energy)
    assert described["static_w_fitted"] == costs.static_w and described["basis"] == "modelled split of measured energy"
