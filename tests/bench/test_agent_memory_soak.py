"""The soak's poll-time figures (benchmarks/agent_memory_soak.py): the quantile of a window of the
agent's poll-duration histogram, as Prometheus's histogram_quantile computes it, worked by hand."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "agent_memory_soak.py"
_spec = importlib.util.spec_from_file_location("agent_memory_soak", _PATH)
soak = importlib.util.module_from_spec(_spec)
sys.modules["agent_memory_soak"] = soak  # dataclasses look their module up there
_spec.loader.exec_module(soak)  # type: ignore[union-attr]

INF = float("inf")


def test_a_window_of_the_histogram_and_its_quantiles() -> None:
    earlier = soak.PollHistogram(0.5, 10, ((0.01, 3), (0.05, 8), (0.1, 10), (INF, 10)))
    later = soak.PollHistogram(0.9, 20, ((0.01, 5), (0.05, 14), (0.1, 20), (INF, 20)))
    window = later.minus(earlier)  # 10 polls: 2 up to 10 ms, 4 in (10, 50], 4 in (50, 100]
    assert window.count == 10 and math.isclose(window.total_s, 0.4)
    assert window.buckets == ((0.01, 2), (0.05, 6), (0.1, 10), (INF, 10))
    # rank 5 of 10 is the 3rd of the 4 polls in (0.01, 0.05]: 0.01 + 0.04 * 3/4
    assert math.isclose(window.quantile(0.5), 0.04)
    # rank 9.9 is 3.9 of the 4 polls into (0.05, 0.1]: 0.05 + 0.05 * 3.9/4
    assert math.isclose(window.quantile(0.99), 0.09875)
    # rank 1 of 2 in the first bucket, which starts at 0
    assert math.isclose(window.quantile(0.1), 0.005)


def test_a_rank_past_the_highest_bound_is_that_bound_and_no_polls_is_nan() -> None:
    slow = soak.PollHistogram(30.0, 4, ((2.5, 1), (5.0, 1), (INF, 4)))
    assert slow.quantile(0.99) == 5.0  # 3 of the 4 polls took longer than the highest bucket says
    assert math.isnan(soak.PollHistogram(0.0, 0, ((0.01, 0), (INF, 0))).quantile(0.5))
    assert math.isnan(soak.PollHistogram(float("nan"), float("nan"), ()).quantile(0.5))
