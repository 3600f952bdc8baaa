"""bench.serving.switchback_run: the switches on real processes, the stopped share by hand, and one short
real run against `serve` whose calibration arm stops the engine for a share of time known in advance."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from infersight.bench.serving.config import CALIBRATION_ARM, ServingBenchConfig
from infersight.bench.serving.switchback_run import EnginePause, StopSwitch, bench_serving_switchback, stopped_share


PAIRS = 16  # the known-loss run's pairs of 1-s blocks (its comment)


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_a_stop_switch_stops_the_process_in_off_blocks_and_leaves_it_running() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        switch = StopSwitch(proc.pid)
        switch.set("off")
        time.sleep(0.1)
        assert _state(proc.pid) == "T"
        switch.set("on")
        time.sleep(0.1)
        assert _state(proc.pid) == "S"
        switch.set("off")
        switch.close()
        time.sleep(0.1)
        assert _state(proc.pid) == "S"
        StopSwitch(None).set("off")  # none_again's switch: nothing to stop
    finally:
        proc.kill()
        proc.wait()


def test_the_stopped_share_is_the_overlap_of_stops_with_each_state() -> None:
    blocks = pd.DataFrame({"pair": [0, 0, 1, 1], "state": ["on", "off", "off", "on"],
                           "start_s": [0.0, 1.0, 2.0, 3.0], "end_s": [1.0, 2.0, 3.0, 4.0]})
    # 0.1 s inside the first on block, 0.2 s across the on -> off switch (0.1 each side), 0.3 s in the last.
    stops = [(0.2, 0.3), (0.9, 1.1), (3.5, 3.8)]
    assert stopped_share(stops, blocks) == pytest.approx({"on": (0.1 + 0.1 + 0.3) / 2, "off": 0.1 / 2})


def test_the_engine_pause_stops_the_process_for_its_share_only_while_on() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pause = EnginePause(proc.pid, share=0.2, period_s=0.1)
        time.sleep(0.3)
        assert pause.stops == []  # off until set on
        pause.set("on")
        start = time.monotonic()
        time.sleep(1.0)
        pause.set("off")
        end = time.monotonic()
        time.sleep(0.1)  # a stop in flight ends
        pause.close()
        stopped = sum(e - s for s, e in pause.stops)
        assert 8 <= len(pause.stops) <= 11
        assert stopped / (end - start) == pytest.approx(0.2, abs=0.05)
        assert _state(proc.pid) == "S"  # never left stopped
    finally:
        proc.kill()
        proc.wait()


def test_a_known_loss_is_read_back_from_the_clients_clock() -> None:
    """serve's engine stopped for 25% of the on blocks: the clients' on/off tokens/s must read that loss
    (the expected ratio from the pauser's own record of the stops), and the A/A arm must not."""
    config = ServingBenchConfig(clients=8, max_tokens=16, max_tokens_spread=0.5, warmup_s=2.0, rounds=1,
                                arms=("none", "none_again"), switchback_block_s=1.0, switchback_pairs=PAIRS, calibration_pause=0.25)
    report = bench_serving_switchback(config, log=lambda _: None)
    paused, aa = report["arms"][CALIBRATION_ARM], report["arms"]["none_again"]
    assert paused["stopped_share_on"] == pytest.approx(0.25, abs=0.02) and paused["stopped_share_off"] < 0.02
    assert paused["pairs"] == aa["pairs"] == PAIRS and paused["errors"] == aa["errors"] == 0
    # Tokens per block recounted from the raw client records.
    blocks, tokens = report["frames"]["blocks"], report["frames"]["tokens"]
    one = blocks[blocks["arm"] == CALIBRATION_ARM].iloc[0]
    t = tokens.loc[tokens["arm"] == CALIBRATION_ARM, "t_s"]
    assert one["tokens"] == ((t >= one["start_s"]) & (t < one["end_s"])).sum()
    # The loss is seen (its interval excludes none) and its size is the known one within the CPU's noise: on
    # this 2-core VM a pair's ratio scatters by ~15% at 1-s blocks (A/A over 12 pairs, seeds 1-3: 0.937, 1.002,
    # 0.980; 25% stopped read 0.657 and 0.731 over 8 pairs, 2026-12-05), so 0.15 is three standard errors.
    # At 10 pairs one run of the suite (12-05 evening, loaded) read an interval up to 1.016: one slow block in
    # ten pairs widens it past 1; PAIRS pairs dilute such a pair. With every answer 16 tokens long the clients
    # run in waves about a block long (tokens per 1-s block swung 19-121 on an idle machine): on 12-06 equal
    # lengths read an interval reaching past 1 in 3 of 3 runs, lengths spread +-50% in 0 of 5 (upper ends
    # 0.79-0.98), the same runs' ratios 0.706-0.846 against ~0.752 expected.
    # The 0.5% the method is for is resolved on the H200 (BENCHMARKS.md), not here.
    assert paused["tokens_per_s_ratio_interval"][1] < 1.0
    assert paused["tokens_per_s_ratio"] == pytest.approx(paused["expected_ratio"], abs=0.15)
    assert aa["tokens_per_s_ratio"] > paused["tokens_per_s_ratio"]
