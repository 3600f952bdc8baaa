"""EnergyMeter fed by the real NvmlCollector over a fake pynvml, with hand-built steps: each
request's joules against a naive reference (exact fractions, shares by hand: token share while the
energy fit is not usable, modelled cost once it is), conservation exact in microjoules, rows
held until their energy is in, and nothing at all on a CPU-only host."""
from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from gpu_fakes import FakeGpuState, FakeNvml  # noqa: E402

from infersight.agent.energy_meter import EnergyMeter  # noqa: E402
from infersight.agent.energy_summary import describe_energy  # noqa: E402
from infersight.gpu.nvml_collector import NvmlCollector  # noqa: E402
from infersight.gpu.sampler import GpuSampler  # noqa: E402

MS = 1_000_000
SM_UTIL = 2  # the fake's NVML_GPM_METRIC_SM_UTIL
#: The sampler's polls: (monotonic ns, total energy in mJ as NVML reports it, GPM SM util %).
POLLS = [(1000 * MS, 8_000_000, 10.0), (2000 * MS, 8_000_613, 50.0), (3000 * MS, 8_001_501, 80.0),
         (4000 * MS, 8_001_750, 20.0)]
#: Steps: (step_id, start, end, [(request, tokens)]). Step 3 ran nobody (its energy is idle).
STEPS = [(1, 1200 * MS + 7, 1700 * MS, [(1, 3), (2, 1)]), (2, 1900 * MS, 2600 * MS + 3, [(1, 1), (2, 1), (3, 1)]),
         (3, 2650 * MS, 2700 * MS, []), (4, 3100 * MS, 3900 * MS + 11, [(3, 5)])]


class Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def frames(steps: list) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Step and batch frames; every member counted as prefill (token share: kinds do not matter)."""
    s = pd.DataFrame([(i, a, b, len(m), sum(n for _, n in m), 0, 0) for i, a, b, m in steps],
                     columns=["step_id", "start_ns", "end_ns", "batch_size", "prefill_tokens", "decode_tokens",
                              "spec_tokens"])
    b = pd.DataFrame([(i, r, n) for i, _, _, m in steps for r, n in m], columns=["step_id", "request_id", "num_tokens"])
    return s, b.astype("int64")


def naive_energy_uj(t: int) -> Fraction:
    """The counter in uJ at t: linear between the two polls around it."""
    for (t0, e0, _), (t1, e1, _) in zip(POLLS, POLLS[1:]):
        if t0 <= t <= t1:
            return e0 * 1000 + Fraction((e1 - e0) * 1000) * (t - t0) / (t1 - t0)
    raise AssertionError(t)


def naive_shares(amount: int, members: list[tuple[int, int]]) -> dict[int, int]:
    """Largest remainder by hand: floors, then one more uJ for the largest remainders (ties: order)."""
    total = sum(n for _, n in members)
    exact = [(r, Fraction(amount * n, total)) for r, n in members]
    parts = {r: int(x) for r, x in exact}
    left = amount - sum(parts.values())
    for r, _ in sorted(exact, key=lambda rx: -(rx[1] - int(rx[1])))[:left]:
        parts[r] += 1
    return parts


def naive_reference() -> tuple[dict[int, int], int]:
    """(request -> uJ, idle uJ) over [first poll, last step end]."""
    per_request: dict[int, int] = {}
    in_steps_with_requests = 0
    for _, start, end, members in STEPS:
        amount = round(naive_energy_uj(end)) - round(naive_energy_uj(start))
        if members:
            in_steps_with_requests += amount
            for r, uj in naive_shares(amount, members).items():
                per_request[r] = per_request.get(r, 0) + uj
    delta = round(naive_energy_uj(STEPS[-1][2])) - round(naive_energy_uj(POLLS[0][0]))
    return per_request, delta - in_steps_with_requests


@pytest.fixture
def gpu() -> tuple[FakeGpuState, Clock, GpuSampler]:
    state = FakeGpuState(uuid="GPU-fake-0", gpm_values={SM_UTIL: 0.0})
    clock = Clock()
    clock.ns = POLLS[0][0] - 500 * MS  # the collector opens (first GPM sample) before the first poll
    sampler = GpuSampler(NvmlCollector(FakeNvml([state]), gpm_min_interval_s=0.0, clock=clock), interval_s=1.0)
    return state, clock, sampler


def poll(gpu: tuple[FakeGpuState, Clock, GpuSampler], k: int, meter: EnergyMeter) -> None:
    state, clock, sampler = gpu
    clock.ns, state.energy_mj, state.gpm_values[SM_UTIL] = POLLS[k]
    sampler.poll_once()
    meter.add_samples(sampler.recent())


def test_before_a_usable_fit_each_request_gets_its_token_share_and_the_account_conserves_exactly(gpu) -> None:
    clock = gpu[1]
    meter = EnergyMeter(clock=clock)
    steps, batch = frames(STEPS)
    poll(gpu, 0, meter)
    assert meter.active and meter.cursor_ns == POLLS[0][0]
    meter.add_steps(steps.iloc[:1], batch[batch.step_id == 1])
    assert meter.attribute() == 0 and meter.steps_measured == 0  # no reading after step 1's end yet
    # Request 1 finished inside step 2: its row waits until step 2 is measured.
    assert meter.ready([1], [2500 * MS]) == []
    poll(gpu, 1, meter)
    meter.attribute()
    meter.add_steps(steps.iloc[1:3], batch[batch.step_id.isin([2, 3])])
    meter.attribute()  # step 2 ends after the 2nd reading: waits
    assert meter.steps_measured == 1 and meter.ready([1], [2500 * MS]) == []
    poll(gpu, 2, meter)
    meter.attribute()
    assert meter.ready([1], [2500 * MS]) == [1]
    meter.add_steps(steps.iloc[3:], batch[batch.step_id == 4])
    poll(gpu, 3, meter)
    meter.attribute()

    expected, idle = naive_reference()
    got = {r: meter.open[r][0] for r in (1, 2, 3)}
    assert got == expected  # exact microjoules
    assert meter.idle_uj == idle
    delta = round(naive_energy_uj(STEPS[-1][2])) - POLLS[0][1] * 1000
    assert meter.requests_uj + meter.idle_uj == delta == sum(got.values()) + idle
    summary = describe_energy(meter)
    assert summary["counter_delta_j"] == delta / 1e6 and summary["steps_measured"] == 4
    taken = meter.take(3)
    assert taken["energy_j"] == expected[3] / 1e6 and 3 not in meter.open
    # No usable fit: no dynamic/static cut, and the summary does not pretend one.
    assert math.isnan(taken["energy_dynamic_j"]) and math.isnan(taken["energy_static_j"])
    assert summary["dynamic_j"] == summary["static_j"] == 0 and summary["static_w_fitted"] is None
    # The tail after the last step is idle at close: the account then spans every reading.
    meter.close()
    assert meter.requests_uj + meter.idle_uj == (POLLS[-1][1] - POLLS[0][1]) * 1000
    # Three steps with requests are too few to fit step time on: each went by token share, and says so.
    assert not meter.costs.usable and meter.steps_by_model == 0 and meter.steps_by_tokens == 3


def test_sm_active_seconds_follow_the_gpm_windows(gpu) -> None:
    meter = EnergyMeter(clock=gpu[1])
    steps, batch = frames(STEPS[:1])
    poll(gpu, 0, meter)
    meter.add_steps(steps, batch)
    poll(gpu, 1, meter)
    meter.attribute()
    # GPM's 50% covers (1000 ms, 2000 ms]: step 1 (500 ms - 7 ns) was SM-active 250 ms - 3.5 ns,
    # split 3:1 between requests 1 and 2 (in integer ns, largest remainder).
    active_ns = round(Fraction(50, 100) * (STEPS[0][2] - STEPS[0][1]))
    parts = naive_shares(active_ns, STEPS[0][3])
    assert (meter.open[1][1], meter.open[2][1]) == (parts[1], parts[2])


def test_a_cpu_host_measures_nothing_and_holds_no_row() -> None:
    meter = EnergyMeter()
    steps, batch = frames(STEPS)
    meter.add_samples([])
    meter.add_steps(steps, batch)
    assert not meter.active and meter.attribute() == 0 and meter.pending_steps.empty
    assert meter.ready([1, 2], [5, 6]) == [1, 2]
    assert all(math.isnan(x) for x in meter.take(1).values())
    assert describe_energy(meter)["measured"] is False


def test_rows_stop_waiting_when_readings_stop(gpu) -> None:
    clock = gpu[1]
    meter = EnergyMeter(wait_s=5.0, clock=clock)
    poll(gpu, 0, meter)
    clock.ns = POLLS[0][0] + 1 * MS
    assert meter.ready([9], [POLLS[0][0] + 1]) == []  # finished after the account: held
    clock.ns = POLLS[0][0] + 6000 * MS  # no reading for 6 s: the sampler is stuck or gone
    assert meter.ready([9], [POLLS[0][0] + 1]) == [9]


#: The known answer: the counter rises by EP mJ per prefill token and ED mJ per decode token the steps
#: feed, and by PS watts over the steps' time (static power). The fit must find these; each step's
#: energy is cut into dynamic EP x prefill + ED x decode and static PS x its time in that proportion, and
#: both are split by EP x a member's prefill tokens + ED x its decode tokens.
EP, ED, PS = 2, 15, 100
#: Step time (ns), only where the steps lie: the counter is read at step boundaries, so each interval's
#: rise is its steps' energy; inside an interval a step gets its share of the time (interpolation).
C0, TP, TD = 2 * MS, 100_000, 1 * MS
#: (step_id, [(request, prefill tokens, decode tokens)]), back to back from 10 ms. Steps 2, 4 and 6 mix
#: a prefill chunk with decodes: their chunk events tell the members apart.
MODEL_STEPS = [(1, [(1, 20, 0)]), (2, [(2, 10, 0), (1, 0, 1)]), (3, [(1, 0, 1), (2, 0, 1)]),
               (4, [(3, 30, 0), (1, 0, 1), (2, 0, 1)]), (5, [(1, 0, 1), (2, 0, 1), (3, 0, 1)]),
               (6, [(4, 5, 0), (1, 0, 1), (2, 0, 1), (3, 0, 1)]), (7, [(1, 0, 1), (2, 0, 1), (3, 0, 1), (4, 0, 1)]),
               (8, [(2, 0, 1), (3, 0, 1), (4, 0, 1)]), (9, [(3, 0, 1), (4, 0, 1)]), (10, [(4, 0, 1)])]
#: The counter is read before step 1 and after these steps: some intervals hold two steps (a step's
#: energy is then its share of the interval's time), and there are enough intervals (8) for a fit of
#: three regressors (static, prefill, decode: token_cost.MIN_INTERVALS_PER_KIND each).
READ_AFTER = (1, 2, 4, 5, 6, 8, 9, 10)


def model_timeline() -> tuple[list[tuple[int, int, int, list]], list[tuple[int, int]]]:
    """([(step_id, start_ns, end_ns, members)], [(reading ns, counter mJ)]) from the truth above."""
    steps, t = [], 10 * MS
    for sid, members in MODEL_STEPS:
        end = t + C0 + TP * sum(m[1] for m in members) + TD * sum(m[2] for m in members)
        steps.append((sid, t, end, members))
        t = end
    readings, mj = [(10 * MS, 500_000)], 500_000
    for sid, start, end, members in steps:
        mj += sum(EP * pt + ED * dt for _, pt, dt in members) + PS * (end - start) // 1_000_000  # W x ns -> mJ
        if sid in READ_AFTER:
            readings.append((end, mj))
    return steps, readings


def model_frames() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    steps, batch, chunks = [], [], []
    for sid, start, end, members in model_timeline()[0]:
        steps.append((sid, start, end, len(members), sum(m[1] for m in members), sum(m[2] for m in members), 0))
        batch += [(sid, r, pt + dt) for r, pt, dt in members]
        chunks += [("PREFILL_CHUNK", r, start) for r, pt, _ in members if pt]
    return (pd.DataFrame(steps, columns=["step_id", "start_ns", "end_ns", "batch_size", "prefill_tokens",
                                         "decode_tokens", "spec_tokens"]),
            pd.DataFrame(batch, columns=["step_id", "request_id", "num_tokens"]),
            pd.DataFrame(chunks, columns=["event", "request_id", "ts_ns"]))


def model_counter_uj(t: int) -> Fraction:
    readings = model_timeline()[1]
    for (t0, e0), (t1, e1) in zip(readings, readings[1:]):
        if t0 <= t <= t1:
            return e0 * 1000 + Fraction((e1 - e0) * 1000) * (t - t0) / (t1 - t0)
    raise AssertionError(t)


def modelled_reference() -> tuple[dict[int, int], dict[int, int]]:
    """(request -> uJ, request -> dynamic uJ): each step's energy (exact interpolation) cut into
    dynamic (its true token cost over that plus PS x its time, rounded) and static, each split by
    cost from the true EP, ED as fractions of 2**-20 (the documented resolution of a weight), then
    largest remainder by hand."""
    energy: dict[int, int] = {}
    dynamic: dict[int, int] = {}
    for _, start, end, members in model_timeline()[0]:
        amount = round(model_counter_uj(end)) - round(model_counter_uj(start))
        cost = [Fraction(EP * pt + ED * dt) for _, pt, dt in members]
        weights = [round(c / sum(cost) * 2**20) for c in cost]
        dyn = round(amount * sum(cost) / (sum(cost) + Fraction(PS * (end - start), 1_000_000)))
        shares = [(m[0], w) for m, w in zip(members, weights)]
        for (r, d), (_, st) in zip(naive_shares(dyn, shares).items(), naive_shares(amount - dyn, shares).items()):
            energy[r], dynamic[r] = energy.get(r, 0) + d + st, dynamic.get(r, 0) + d
    return energy, dynamic


def model_meter(gpu, with_chunks: bool = True) -> EnergyMeter:
    state, clock, sampler = gpu
    meter = EnergyMeter(clock=clock)
    steps, batch, chunks = model_frames()
    for k, (t, mj) in enumerate(model_timeline()[1]):
        clock.ns, state.energy_mj = t, mj
        sampler.poll_once()
        meter.add_samples(sampler.recent())
        if k == 0:
            meter.add_prefill_chunks(chunks if with_chunks else chunks.iloc[:0])
            meter.add_steps(steps, batch)
    meter.attribute()  # all ten steps at once: the fit they are split by is the one over all of them
    return meter


def test_once_the_fit_is_usable_each_step_is_split_by_modelled_cost(gpu) -> None:
    gpu[1].ns = 0
    meter = model_meter(gpu)
    costs = meter.costs
    assert costs.usable and costs.intervals == len(READ_AFTER)
    assert (costs.prefill_uj, costs.decode_uj, costs.spec_uj) == pytest.approx((EP * 1000, ED * 1000, 0), rel=1e-6)
    assert costs.static_w == pytest.approx(PS, rel=1e-6)
    assert meter.steps_by_model == 10 and meter.steps_by_tokens == 0
    expected, dynamic = modelled_reference()
    assert {r: meter.open[r][0] for r in expected} == expected
    assert {r: meter.open[r][3] for r in dynamic} == dynamic
    assert meter.dynamic_uj == sum(dynamic.values()) and meter.static_uj == sum(expected.values()) - meter.dynamic_uj
    # Token share would have given request 1 (a long prompt, 6 decodes) a different figure: the check bites.
    token_share = sum(naive_shares(round(model_counter_uj(e)) - round(model_counter_uj(s)),
                                   [(m[0], m[1] + m[2]) for m in ms]).get(1, 0)
                      for _, s, e, ms in model_timeline()[0])
    assert expected[1] != token_share
    described = describe_energy(meter)
    assert described["basis"] == "modelled split of measured energy"
    assert described["split_model"]["decode_mj_per_token"] == pytest.approx(ED, rel=1e-6)
    assert described["static_w_fitted"] == pytest.approx(PS, rel=1e-6) and described["unsplit_j"] == 0
    taken = meter.take(1)
    assert round(taken["energy_dynamic_j"] * 1e6) == dynamic[1]
    assert round(taken["energy_static_j"] * 1e6) == expected[1] - dynamic[1] > 0


def test_a_mixed_step_without_its_chunk_event_goes_by_token_share(gpu) -> None:
    gpu[1].ns = 0
    meter = model_meter(gpu, with_chunks=False)
    # Steps 2, 4 and 6 mix kinds; without chunk events their members cannot be told apart.
    assert meter.steps_by_model == 7 and meter.steps_by_tokens == 3
