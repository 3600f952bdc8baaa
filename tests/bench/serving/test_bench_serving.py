"""bench.serving.run: the phase figures and the summary by hand on tiny frames, then one short real run
(serve + clients + an agent arm) whose figures are recomputed from its raw client records."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from infersight.bench.serving.run import bench_serving
from infersight.bench.serving.clients import phase_figures
from infersight.bench.serving.config import ARMS, ServingBenchConfig
from infersight.bench.serving.report import median_interval, summarise
from infersight.commands.bench import SERVING_ARMS


def test_the_cli_offers_the_modules_arms() -> None:
    assert SERVING_ARMS == ARMS


def test_phase_figures_by_hand() -> None:
    # Window [10, 20). Request 1: sent 9, tokens at 9.5 (before the window), 11, 12 -> done 12.
    # Request 2: sent 10, tokens 10.2, 10.7, 11.9 -> done 12. Request 3: sent 15, tokens 16, 19.5, 21 ->
    # done 21 (after the window). Request 4 failed (status 500) at 13.
    tokens = pd.DataFrame({"request": [1, 1, 1, 2, 2, 2, 3, 3, 3],
                           "t_s": [9.5, 11.0, 12.0, 10.2, 10.7, 11.9, 16.0, 19.5, 21.0]})
    requests = pd.DataFrame({"request": [1, 2, 3, 4], "sent_s": [9.0, 10.0, 15.0, 13.0],
                             "first_s": [9.5, 10.2, 16.0, math.nan], "done_s": [12.0, 12.0, 21.0, 13.0],
                             "tokens": [3, 3, 3, 0], "status": [200, 200, 200, 500]})
    f = phase_figures(tokens, requests, 10.0, 20.0)
    assert f["tokens_per_s"] == pytest.approx(7 / 10)  # every token but 9.5 and 21.0
    assert f["requests_per_s"] == pytest.approx(2 / 10)  # requests 1 and 2 finished inside
    # Started inside: requests 2 and 3 (TTFT 0.2 and 1.0); their gaps 0.5, 1.2, 3.5, 1.5.
    assert f["ttft_p50_s"] == pytest.approx(0.6)
    assert f["itl_p50_s"] == pytest.approx((1.2 + 1.5) / 2)
    assert f["errors"] == 1


def test_a_chunk_of_two_tokens_counts_two_tokens_and_one_gap() -> None:
    # Request 1 sent at 10: chunks at 10.5 (one token), 11.0 (two tokens: the server merged them), 12.0.
    tokens = pd.DataFrame({"request": [1, 1, 1, 1], "t_s": [10.5, 11.0, 11.0, 12.0]})
    requests = pd.DataFrame({"request": [1], "sent_s": [10.0], "first_s": [10.5], "done_s": [12.0],
                             "tokens": [4], "status": [200]})
    f = phase_figures(tokens, requests, 10.0, 20.0)
    assert f["tokens_per_s"] == pytest.approx(4 / 10)
    # gaps between chunks: 0.5 and 1.0 (no zero gap inside the merged chunk)
    assert f["itl_p50_s"] == pytest.approx(0.75) and f["itl_p99_s"] == pytest.approx(0.5 + 0.99 * 0.5)


def test_summary_ratios_are_per_round_and_the_aa_floor_is_none_again() -> None:
    rows = []
    for rnd, (ref, again, agent) in enumerate([(100.0, 101.0, 99.0), (50.0, 49.0, 50.0), (80.0, 80.0, 76.0)]):
        for arm, tps in (("none", ref), ("none_again", again), ("agent", agent)):
            rows.append({"arm": arm, "round": rnd, "tokens_per_s": tps, "requests_per_s": tps / 10,
                         "ttft_p50_s": 0.1, "ttft_p99_s": 0.2, "itl_p50_s": 0.01, "itl_p99_s": 0.02,
                         "errors": 0, "recorder_cost_ratio": math.nan})
    report = summarise(pd.DataFrame(rows), ServingBenchConfig(arms=("none", "none_again", "agent")))
    agent = report["arms"]["agent"]
    assert agent["tokens_per_s_ratio_by_round"] == [0.99, 1.0, 0.95]
    assert agent["tokens_per_s_ratio"] == pytest.approx(0.99)
    assert report["aa_floor"]["tokens_per_s_aa_median"] == pytest.approx(1.0)
    assert report["aa_floor"]["tokens_per_s_aa_max_dev"] == pytest.approx(0.02)


def test_the_median_interval_from_order_statistics_by_hand() -> None:
    # Five rounds: [min, max] misses the median only if all five fall on one side: 2 / 2**5.
    assert median_interval([1.01, 0.98, 1.0, 0.99, 1.02]) == (0.98, 1.02, 1 - 2 / 32)
    # Eight: the 2nd smallest to the 2nd largest misses when 0 or 1 lie below (or above): 2 x 9 / 256;
    # the 3rd to the 6th would cover 1 - 2 x 37 / 256 = 71%, under 90%.
    eight = [0.97, 1.03, 0.99, 1.0, 1.01, 0.995, 1.005, 0.98]
    assert median_interval(eight) == (0.98, 1.01, 1 - 18 / 256)
    # Three rounds cannot give 90% (their [min, max] covers 75%), and NaN rounds do not count.
    assert all(math.isnan(v) for v in median_interval([1.0, 0.9, 1.1, math.nan]))


def test_a_run_resolves_half_a_percent_only_when_its_interval_is_that_narrow() -> None:
    rows = []
    for rnd in range(5):
        for arm, tps in (("none", 100.0), ("agent", 99.0 + 0.2 * rnd), ("none_again", 97.0 + 1.5 * rnd)):
            rows.append({"arm": arm, "round": rnd, "tokens_per_s": tps, "requests_per_s": 1.0, "ttft_p50_s": 0.1,
                         "ttft_p99_s": 0.2, "itl_p50_s": 0.01, "itl_p99_s": 0.02, "errors": 0,
                         "recorder_cost_ratio": math.nan})
    arms = summarise(pd.DataFrame(rows), ServingBenchConfig(arms=("none", "agent", "none_again")))["arms"]
    assert arms["agent"]["tokens_per_s_ratio_interval"] == pytest.approx([0.99, 0.998])  # 0.8% wide
    assert arms["agent"]["resolves"] is True
    assert arms["none_again"]["tokens_per_s_ratio_interval"] == pytest.approx([0.97, 1.03]) and not arms["none_again"]["resolves"]
    assert arms["none"]["resolves"] is None  # the reference over itself: 1 by construction


@pytest.mark.parametrize("kwargs", [{"arms": ("agent",)}, {"arms": ("none", "bogus")}, {"phase_s": 2, "warmup_s": 3},
                                    {"clients": 0}, {"switchback_block_s": 1.0, "arms": ("none",)},
                                    {"switchback_block_s": 1.0, "switchback_pairs": 4},
                                    {"calibration_pause": 0.01}])
def test_bad_configs_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ServingBenchConfig(**kwargs)


def test_a_short_real_run_against_serve() -> None:
    config = ServingBenchConfig(clients=2, max_tokens=6, phase_s=5.0, warmup_s=1.0, rounds=1, arms=("none", "agent"))
    report = bench_serving(config, log=lambda _: None)
    tokens, requests = report["frames"]["tokens"], report["frames"]["requests"]
    for arm in ("none", "agent"):
        req = requests[requests["arm"] == arm]
        assert (req["status"] == 200).all() and len(req) > 0
        # ignore_eos: every request streamed exactly max_tokens chunks, counted from the raw stream.
        per_request = tokens[tokens["arm"] == arm].groupby("request").size()
        assert set(per_request.to_dict().values()) == {6} and sorted(per_request.index) == sorted(req["request"])
        phase = next(p for p in report["phases"] if p["arm"] == arm)
        in_window = [t for t in tokens.loc[tokens["arm"] == arm, "t_s"] if phase["t0_s"] <= t < phase["t1_s"]]
        assert report["arms"][arm]["tokens_per_s"] == pytest.approx(len(in_window) / (phase["t1_s"] - phase["t0_s"]))
        assert report["arms"][arm]["tokens_per_s"] > 0
    assert report["arms"]["none"]["tokens_per_s_ratio"] == 1.0
    assert report["measured"] is True


def test_a_process_that_exits_is_named_with_its_last_log_line(tmp_path):
    """The H200 run that lost its full arm printed only "exited with code 1"; the failure now says why."""
    import subprocess
    import sys

    import pytest

    from infersight.bench.serving.processes import ProcessFailed, wait_health

    log_path = tmp_path / "agent.log"
    with open(log_path, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", "print('starting'); print('infersight: error: no ring'); "
                                 "raise SystemExit(3)"], stdout=out, stderr=subprocess.STDOUT)
    proc.wait()
    with pytest.raises(ProcessFailed) as err:
        wait_health("http://127.0.0.1:9", proc, "infersight agent", log_path, timeout_s=5)
    assert str(err.value) == f"infersight agent exited with code 3: infersight: error: no ring (log: {log_path})"


def test_the_recorder_names_it_reads_are_the_catalogues() -> None:
    """bench reads the agent's exposition from outside, by name: the names must be the ones the agent exports."""
    from infersight.bench.serving.processes import RECORDER_COST_SAMPLE, RECORDER_WINDOWS_SAMPLE
    from infersight.exporters import catalogue as C

    assert (RECORDER_COST_SAMPLE, RECORDER_WINDOWS_SAMPLE) == (C.RECORDER_COST_RATIO.sample, C.RECORDER_WINDOWS.sample)


def test_output_lengths_are_equal_or_spread_uniformly_around_max_tokens() -> None:
    from infersight.bench.serving.clients import output_lengths

    assert output_lengths(ServingBenchConfig(max_tokens=96), 5, seed=0) == [96] * 5
    spread = output_lengths(ServingBenchConfig(max_tokens=96, max_tokens_spread=0.5), 2000, seed=0)
    assert min(spread) == 48 and max(spread) == 144  # 2,000 uniform draws over 97 values reach both ends
    assert abs(sum(spread) / len(spread) - 96) < 2  # the mean stays (sd of the mean ~0.6)
    assert output_lengths(ServingBenchConfig(max_tokens=96, max_tokens_spread=0.5), 2000, seed=0) == spread
    with pytest.raises(ValueError):
        ServingBenchConfig(max_tokens_spread=1.0)
