"""`bench runtime` with async scheduling (forced on the CPU): the decode block's wall clock is
bracketed by the test's own clock around the engine's step calls, and the block's mean step agrees
with the headline median within a bound the test computes from its own timings."""
from __future__ import annotations

import statistics
import time

import pytest
from testkit import one_torch_thread

from infersight.bench.engine.decode_block import DecodeBlockClock
from infersight.bench.engine.runtime import bench_runtime
from infersight.runtime import ModelConfig
from infersight.runtime.engine.engine import Engine
from infersight.runtime.stats import StepStats

TINY = ModelConfig("db-tiny", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=256)
DECODE_STEPS = 14  # the first two warm up: 12 timed


def test_async_decode_block_is_bracketed_by_the_callers_clock_and_agrees_with_the_median(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[float, float, StepStats]] = []  # every Engine.step call: entry, exit, what it returned
    step = Engine.step

    def timed_step(self: Engine) -> StepStats:
        t0 = time.perf_counter()
        stats = step(self)
        calls.append((t0, time.perf_counter(), stats))
        return stats

    monkeypatch.setattr(Engine, "step", timed_step)
    t_call = time.perf_counter()
    with one_torch_thread():
        result = bench_runtime(model=TINY, batch=3, prompt_len=8, decode_steps=DECODE_STEPS,  # type: ignore[arg-type]
                               repeats=1, async_scheduling=True)
    t_call = time.perf_counter() - t_call
    assert result.async_scheduling and result.launched_ahead_share == 1.0  # the timed steps ran ahead: async
    block = result.decode_block
    assert block is not None and block.steps == DECODE_STEPS - 2

    # The decode loop: the DECODE_STEPS calls from the first that decoded (the prefills come before it).
    first = next(i for i, (_, _, stats) in enumerate(calls) if stats.num_decode_tokens > 0)
    loop = calls[first:first + DECODE_STEPS]
    timed = loop[2:]
    after = calls[first + DECODE_STEPS][0] if len(calls) > first + DECODE_STEPS else time.perf_counter()
    block_s = block.block_ms / 1e3
    # Measured independently: it holds the timed steps' calls, and lies between the calls around them.
    lower, upper = timed[-1][1] - timed[0][0], after - loop[1][1]
    assert lower - 1e-6 <= block_s <= upper + 1e-6 and block_s < t_call  # 1 us: the ms rounding of block_ms
    # Agreement, the bound from the test's clock: the block's mean step is its steps' mean (between the
    # fastest and the slowest step) plus the time around them over their number, and the median is one of
    # the steps (each the test's call plus a little of that time): the two differ by at most the steps'
    # spread plus that time per step.
    own = [t1 - t0 for t0, t1, _ in timed]
    outside_per_step = (upper - sum(own)) / len(own)
    bound_ms = 1e3 * (max(own) - min(own) + outside_per_step)
    assert abs(block.block_step_ms - block.step_ms_median) <= bound_ms + 1e-3
    assert abs(block.step_ms_median - result.decode_step_ms) < 1e-3  # the headline is that median
    # The bench times around the test's wrapper: its steps are no shorter than the test's calls.
    assert block.step_ms_median >= 1e3 * statistics.median(own) - 1e-3
    assert block.block_over_step == pytest.approx(block.block_step_ms / block.step_ms_median, rel=1e-3)


def test_a_block_not_timed_whole_is_refused() -> None:
    clock = DecodeBlockClock("cpu", 2, 5)
    clock.enter(2)
    with pytest.raises(ValueError, match="was not timed whole"):
        clock.timing([0.001, 0.001, 0.001])  # leave(4) never came
    with pytest.raises(ValueError, match="at least one step"):
        DecodeBlockClock("cpu", 3, 3)
