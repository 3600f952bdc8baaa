"""EnergyMeter fed by the real NvmlCollector over a fake pynvml, with hand-built steps: each
request's joules against a naive reference (exact fractions, shares by hand), conservation exact
in microjoules, rows held until their energy is in, and nothing at all on a CPU-only host."""
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
    s = pd.DataFrame([(i, a, b, len(m)) for i, a, b, m in steps],
                     columns=["step_id", "start_ns", "end_ns", "batch_size"])
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


def test_each_request_gets_the_naive_joules_and_the_account_conserves_exactly(gpu) -> None:
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
    summary = meter.describe()
    assert summary["counter_delta_j"] == delta / 1e6 and summary["steps_measured"] == 4
    energy_j, _ = meter.take(3)
    assert energy_j == expected[3] / 1e6 and 3 not in meter.open
    # The tail after the last step is idle at close: the account then spans every reading.
    meter.close()
    assert meter.requests_uj + meter.idle_uj == (POLLS[-1][1] - POLLS[0][1]) * 1000


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
    energy_j, sm_s = meter.take(1)
    assert math.isnan(energy_j) and math.isnan(sm_s)
    assert meter.describe()["measured"] is False


def test_rows_stop_waiting_when_readings_stop(gpu) -> None:
    clock = gpu[1]
    meter = EnergyMeter(wait_s=5.0, clock=clock)
    poll(gpu, 0, meter)
    clock.ns = POLLS[0][0] + 1 * MS
    assert meter.ready([9], [POLLS[0][0] + 1]) == []  # finished after the account: held
    clock.ns = POLLS[0][0] + 6000 * MS  # no reading for 6 s: the sampler is stuck or gone
    assert meter.ready([9], [POLLS[0][0] + 1]) == [9]
