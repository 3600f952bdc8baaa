"""The energy model's static power held at the GPU's measured idle power: the meter reads idle power
only on settled idle time (IDLE_SETTLE_NS after the last step), holds the fit's static term there once
MIN_IDLE_READ_NS of it is read, and fits the joules per token on the energy above it. Checked against
a naive reference: the counter interpolated by hand in exact fractions, and numpy's least squares on
intervals built by hand."""
from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from gpu_fakes import FakeGpuState, FakeNvml  # noqa: E402

from infersight.agent.energy_meter import EnergyMeter  # noqa: E402
from infersight.agent.energy_summary import describe_energy  # noqa: E402
from infersight.agent.idle_power import MIN_IDLE_READ_NS  # noqa: E402
from infersight.gpu.nvml_collector import NvmlCollector  # noqa: E402
from infersight.gpu.sampler import GpuSampler  # noqa: E402

S = 1_000_000_000
IDLE_W, BUSY_W = 100, 130  # the GPU idle, and its baseline while steps run (clocks up: more than idle)
EP, ED = 3, 40  # J per prefill token, J per decode token (large, so the fit's figures are clear)
#: One step in each of these 1-s intervals (k s, k + 1 s], from k + 0.05 s to k + 0.95 s: (k, prefill
#: tokens, decode tokens; pure steps, so no chunk events are needed). Intervals 9-11 are idle: the 3.1 s
#: gap between the steps of 8 and 12 is read as idle from 1 s after the first one ended.
STEPS = [(6, 40, 0), (7, 0, 3), (8, 10, 2), (12, 0, 5), (13, 25, 0), (14, 5, 4), (15, 30, 1)]
READINGS_S = range(1, 17)  # the counter is read every second from 1 s to 16 s; the account starts at 1 s


def interval_joules(k: int) -> int:
    """The counter's rise over (k, k+1] s: idle power, or the baseline and the step's tokens."""
    for sk, p, d in STEPS:
        if sk == k:
            return BUSY_W + EP * p + ED * d
    return IDLE_W


def readings_mj() -> list[tuple[int, int]]:
    out, mj = [], 10_000_000
    for t in READINGS_S:
        out.append((t * S, mj))
        mj += interval_joules(t) * 1000
    return out


def counter_uj(t: int) -> Fraction:
    """The counter at t ns, linear between the readings around it (exact)."""
    r = readings_mj()
    for (t0, e0), (t1, e1) in zip(r, r[1:]):
        if t0 <= t <= t1:
            return Fraction(e0 * 1000) + Fraction((e1 - e0) * 1000 * (t - t0), t1 - t0)
    raise AssertionError(t)


def step_bounds(k: int) -> tuple[int, int]:
    return k * S + S // 20, k * S + S * 19 // 20


def run_meter(hold: bool) -> EnergyMeter:
    state = FakeGpuState(uuid="GPU-fake-0")
    clock = type("Clock", (), {"ns": 0, "__call__": lambda self: self.ns})()
    sampler = GpuSampler(NvmlCollector(FakeNvml([state]), gpm=False, clock=clock), interval_s=1.0)
    meter = EnergyMeter(clock=clock, hold_idle_static=hold)
    for t, mj in readings_mj():
        clock.ns, state.energy_mj = t, mj
        sampler.poll_once()
        meter.add_samples(sampler.recent())
    steps = pd.DataFrame([(i, *step_bounds(k), 1, p, d, 0) for i, (k, p, d) in enumerate(STEPS)],
                         columns=["step_id", "start_ns", "end_ns", "batch_size", "prefill_tokens", "decode_tokens",
                                  "spec_tokens"])
    batch = pd.DataFrame({"step_id": steps["step_id"], "request_id": steps["step_id"] + 100,
                          "num_tokens": steps["prefill_tokens"] + steps["decode_tokens"]}).astype("int64")
    meter.add_steps(steps, batch)
    meter.attribute()
    return meter


def naive_idle_w() -> Fraction:
    """Idle read by hand: the whole reading intervals from 1 s after the account began (1 s) to the
    first step's start (2-6 s), and from 1 s after the step of 8 ended to the step of 12's start
    (10-12 s); the gaps of 0.1 s between the other steps are inside the settling time, and the
    parts of intervals that also held a step are not read (their interpolated power is the step's)."""
    spans = [(2 * S, 6 * S), (10 * S, 12 * S)]
    uj = sum(counter_uj(b) - counter_uj(a) for a, b in spans)
    return uj / sum(b - a for a, b in spans) * 1000


def test_idle_power_is_read_on_settled_idle_time_only() -> None:
    meter = run_meter(hold=True)
    assert meter.idle.ns == 6 * S >= MIN_IDLE_READ_NS
    assert meter.idle_w == pytest.approx(float(naive_idle_w()), rel=1e-9)
    assert float(naive_idle_w()) == IDLE_W  # whole idle intervals: the fake's idle power, no step's in it


def test_the_fit_holds_static_at_the_idle_power_and_fits_tokens_on_the_energy_above_it() -> None:
    meter = run_meter(hold=True)
    costs = meter.costs
    assert costs.usable and costs.static_from == "measured idle" and costs.static_w == meter.idle_w
    # By hand: each busy interval holds one step; the step's energy is 0.9 of the interval's (linear),
    # its busy time 0.9 s; the tokens' joules are fitted on energy - idle W x busy s. The last step's
    # interval closes at 16 s, after the account's end (its step's end): it waits, out of the fit.
    rows = []
    for k, p, d in STEPS[:-1]:
        a, b = step_bounds(k)
        energy_j = float(counter_uj(b) - counter_uj(a)) / 1e6
        rows.append((p, d, energy_j - meter.idle_w * (b - a) / S))
    x = np.array([[p, d] for p, d, _ in rows], float)
    y = np.array([r[2] for r in rows])
    (ep, ed), *_ = np.linalg.lstsq(x, y, rcond=None)
    assert (costs.prefill_uj / 1e6, costs.decode_uj / 1e6) == pytest.approx((ep, ed), rel=1e-6)
    described = describe_energy(meter)
    assert described["static_from"] == "measured idle" and described["static_w_fitted"] is None
    assert described["idle_w_measured"] == meter.idle_w and "the measured idle power" in described["headline"]


def test_without_holding_the_static_power_is_fitted() -> None:
    meter = run_meter(hold=False)
    assert meter.idle_w is not None  # read all the same, and reported
    assert meter.costs.static_from == "fitted" and meter.costs.static_w != meter.idle_w
    assert describe_energy(meter)["static_w_fitted"] == meter.costs.static_w


def test_with_the_idle_power_held_a_steps_dynamic_energy_is_what_lies_above_idle() -> None:
    """Each step's dynamic joules: its measured energy less idle W x its time, by hand (the split of
    a one-member step gives its request all of it)."""
    meter = run_meter(hold=True)
    for i, (k, _, _) in enumerate(STEPS[:-1]):
        a, b = step_bounds(k)
        energy_uj = round(counter_uj(b)) - round(counter_uj(a))
        static_uj = meter.costs.static_w * (b - a) / 1e3
        assert meter.open[100 + i][0] == energy_uj
        assert meter.open[100 + i][3] == pytest.approx(energy_uj - static_uj, abs=1)


def test_an_idle_stretch_the_account_passes_in_pieces_is_read_whole() -> None:
    """No steps: the account moves to IDLE_LAG_NS before now at every poll (0.1 s apart), a piece
    shorter than a reading interval each time; the stretch is read from 1 s after the account began
    (1 s) to the last reading the account has passed, whole intervals only."""
    state = FakeGpuState(uuid="GPU-fake-0")
    clock = type("Clock", (), {"ns": 0, "__call__": lambda self: self.ns})()
    sampler = GpuSampler(NvmlCollector(FakeNvml([state]), gpm=False, clock=clock), interval_s=1.0)
    meter = EnergyMeter(clock=clock, hold_idle_static=True)
    mj = 10_000_000
    for tenth in range(10, 101):  # 1.0 s .. 10.0 s
        clock.ns = tenth * S // 10
        if tenth % 10 == 0:  # a reading every second: 100 W, but 180 W over (4 s, 5 s] (a neighbour's burst, say)
            state.energy_mj = mj
            sampler.poll_once()
            meter.add_samples(sampler.recent())
            mj += (180 if tenth == 40 else IDLE_W) * 1000
        meter.attribute()
    # The account stands at 8 s (10 s less the lag): intervals 2-8 s read, by hand from the readings.
    assert meter.cursor_ns == 8 * S and meter.idle.ns == 6 * S
    assert meter.idle_w == pytest.approx((5 * IDLE_W + 180) / 6, rel=1e-9)
