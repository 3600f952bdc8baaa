"""agent.poll_timer: cumulative buckets by hand, and a real agent's /metrics counting its polls."""
from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infersight.agent.config import AgentConfig
from infersight.agent.capture.config import CaptureConfig
from infersight.agent.gpu_config import GpuConfig
from infersight.agent.poll_timer import PollTimer
from infersight.agent.service import Agent
from infersight.exporters import catalogue as C


def test_buckets_are_cumulative_and_the_sum_is_exact() -> None:
    timer = PollTimer()
    for s in (0.0005, 0.001, 0.003, 0.003, 7.0):  # 0.001 is a bound: it counts in its own bucket (le)
        timer.observe(s)
    buckets, total = timer.snapshot()
    got = dict(buckets)
    assert got["0.001"] == 2 and got["0.0025"] == 2 and got["0.005"] == 4 and got["5.0"] == 4
    assert got["+Inf"] == 5 and total == pytest.approx(7.0075)
    assert [b for b, _ in buckets] == [*map(str, C.AGENT_POLL_DURATION.buckets), "+Inf"]


def test_an_agent_counts_every_poll_on_metrics(tmp_path: Path) -> None:
    agent = Agent(AgentConfig(rings=["infersight-poll-timer-none"], port=0,
                              captures=CaptureConfig(token_file=str(tmp_path / "token")),
                              gpu=GpuConfig(source="none")))  # a ring that is not there: the polls still run
    try:
        for _ in range(7):
            agent.poll_once()
        fams = {f.name: f for f in text_string_to_metric_families(generate_latest(agent.registry).decode())}
        samples = {s.name: s.value for s in fams[C.AGENT_POLL_DURATION.name].samples if not s.labels.get("le")}
        assert samples[C.AGENT_POLL_DURATION.name + "_count"] == 7
        assert samples[C.AGENT_POLL_DURATION.name + "_sum"] > 0
    finally:
        agent.close()
