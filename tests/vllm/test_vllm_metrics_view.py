"""vLLM's /metrics served under infersight names by the agent (--vllm-url), without a real vLLM:
a real public vLLM scrape (../shared/fixtures), a hand-built two-engine scrape with non-zero values,
broken targets, and the ring-wins rule. Expected values are read from the text by the test's own
naive reader (vllm_exposition_reader), never by the code under test."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from vllm_exposition_reader import TextServer, assert_view_matches, read_samples, total, values

from infersight.agent.config import AgentConfig
from infersight.sources.vllm.http_config import VllmHttpConfig
from infersight.agent.service import Agent
from infersight.exporters import catalogue as C
from infersight.exporters.scraped_view import MergedCollector, ScrapedView
from infersight.sources.vllm.metrics import parse_vllm_text

FIXTURE = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "vllm_metrics_sample.prom"

@pytest.fixture
def served() -> Iterator[tuple[TextServer, list[tuple[int, str, float]]]]:
    """A fake /metrics endpoint whose next answer the test sets: reply[0] = (status, body, delay_s)."""
    reply = [(200, "", 0.0)]
    server = TextServer(lambda: reply[0])
    yield server, reply
    server.close()


def agent_on(url: str, background: bool = False) -> Agent:
    """An agent serving HTTP; unless background, its scraper thread is stopped at once and the test
    drives the scrapes itself (the thread may have made one attempt before)."""
    agent = Agent(AgentConfig(port=0, vllm_server=VllmHttpConfig(url=url, metrics_interval_s=0.5)))
    agent.start_http()
    if not background:
        agent.vllm_metrics.stop()
    return agent


def scrape(agent: Agent) -> dict:
    return read_samples(httpx.get(f"http://127.0.0.1:{agent.port}/metrics", timeout=10).text)


def test_the_public_vllm_scrape_is_served_under_our_names(served) -> None:
    if not FIXTURE.is_file():
        pytest.skip(f"shared fixture {FIXTURE} is absent (the ../shared checkout is missing)")
    server, reply = served
    text = FIXTURE.read_text()
    reply[0] = (200, text, 0.0)
    agent = agent_on(server.url)
    try:
        assert agent.vllm_metrics.scrape_once() is not None
        ours, theirs = scrape(agent), read_samples(text)
        assert_view_matches(ours, theirs)
        # vLLM's bucket bounds are kept: TTFT has the server's 22 finite bounds and +Inf.
        assert len(values(ours, "infersight_time_to_first_token_seconds_bucket", "le")) == 23
        # Only what vLLM has: no spec decoding, no KV block ages in this scrape, no engine/model labels.
        assert total(ours, "infersight_spec_draft_tokens_total") == 0
        assert not [k for k in ours if k[0].startswith("infersight_kv_block_age")
                    and k[0].endswith("_count")]
        assert not [k for k in ours if "engine" in {name for name, _ in k[1]}]
        # model_name is the agent's own identity label (its served model), the same on every series
        assert {v for k in ours for name, v in k[1] if name == "model_name"} == {agent.config.exposition.model_name}
        assert total(ours, "infersight_source_scrape_errors_total") == 0
    finally:
        agent.close()


#: vLLM's spelling (TYPE lines name counters with _total); the spec-decode lines have no TYPE line.
TWO_ENGINES = """\
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 23.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 40.0
vllm:generation_tokens_total{engine="1",model_name="m"} 2.0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 96.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 32.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 64.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_total{engine="1",model_name="m"} 1.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5.0
vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} 2.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 30.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 45.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 45.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 140.0
vllm:iteration_tokens_total_bucket{engine="1",le="1.0",model_name="m"} 2.0
vllm:iteration_tokens_total_bucket{engine="1",le="+Inf",model_name="m"} 3.0
vllm:iteration_tokens_total_count{engine="1",model_name="m"} 3.0
vllm:iteration_tokens_total_sum{engine="1",model_name="m"} 25.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 5.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 6.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 6.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.75
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.01",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 1.5
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
"""


def test_two_engines_are_summed_and_kv_usage_averaged(served) -> None:
    server, reply = served
    reply[0] = (200, TWO_ENGINES, 0.0)
    agent = agent_on(server.url)
    try:
        agent.vllm_metrics.scrape_once()
        ours = scrape(agent)
        assert_view_matches(ours, read_samples(TWO_ENGINES))
        # The same, spelled out for the numbers above:
        assert total(ours, "infersight_prompt_tokens_total", task="other") == 123.0
        assert values(ours, "infersight_requests_total", "finish_reason") == {"length": 7.0, "stop": 1.0}
        assert total(ours, "infersight_kv_cache_usage_ratio") == 0.5
        assert total(ours, "infersight_steps_total") == 48.0
        assert values(ours, "infersight_time_to_first_token_seconds_bucket", "le") == \
            {"0.01": 1.0, "0.1": 6.0, "+Inf": 8.0}
        assert total(ours, "infersight_spec_draft_tokens_total", task="other") == 30.0
        assert total(ours, "infersight_spec_accepted_tokens_total", task="other") == 12.0
        assert values(ours, "infersight_spec_position_accepted_total", "position") == {"0": 8.0, "1": 4.0}
        # vLLM has no proposed-per-position count: that series is not invented.
        assert total(ours, "infersight_spec_position_proposed_total") == 0
    finally:
        agent.close()


@pytest.mark.parametrize("status, body, delay, reason", [
    (200, "hello world\n<html>not metrics</html>\n", 0.0, "unparsable"),
    (200, "# TYPE up gauge\nup 1\n", 0.0, "no_engine_metrics"),
    (503, "busy", 0.0, "http_status"),
    (200, TWO_ENGINES, 1.5, "timeout"),  # slower than the scrape timeout (the 0.5 s interval)
])
def test_a_broken_target_is_counted_logged_once_and_the_agent_serves(served, caplog, status, body, delay,
                                                                     reason) -> None:
    server, reply = served
    reply[0] = (status, body, delay)
    caplog.set_level(logging.INFO, logger="infersight.agent")
    agent = agent_on(server.url)
    try:
        before = scrape(agent)  # the scraper thread may have made its first attempt already
        for _ in range(3):
            assert agent.vllm_metrics.scrape_once() is None
        ours = scrape(agent)
        for name, labels in (("infersight_source_scrape_errors_total", {"reason": reason}),
                             ("infersight_source_scrapes_total", {})):
            assert total(ours, name, source="vllm", **labels) - total(before, name, source="vllm", **labels) == 3
        assert total(ours, "infersight_prompt_tokens_total") == 0  # nothing invented
        failures = [r for r in caplog.records if "vLLM metrics" in r.getMessage() and reason in r.getMessage()]
        assert len(failures) == 1 and "\n" not in failures[0].getMessage()
        assert httpx.get(f"http://127.0.0.1:{agent.port}/health", timeout=5).status_code == 200
        reply[0] = (200, TWO_ENGINES, 0.0)  # the target recovers: served again, and said once
        assert agent.vllm_metrics.scrape_once() is not None
        assert total(scrape(agent), "infersight_prompt_tokens_total", task="other") == 123.0
        assert any("scraping again" in r.getMessage() for r in caplog.records)
    finally:
        agent.close()


def test_connection_refused_is_counted_and_the_agent_serves() -> None:
    from testkit import free_port

    agent = agent_on(f"http://127.0.0.1:{free_port()}", background=True)
    try:
        deadline = time.monotonic() + 10
        while not agent.vllm_metrics.counts()[1] and time.monotonic() < deadline:
            time.sleep(0.1)  # the scraper thread's first attempt
        ours = scrape(agent)
        assert total(ours, "infersight_source_scrape_errors_total", reason="unreachable") >= 1
        assert httpx.get(f"http://127.0.0.1:{agent.port}/api/v1/summary", timeout=5).status_code == 200
    finally:
        agent.close()


class FixedFamilies(Collector):
    """Stands in for the agent's own (ring-fed) exposition: whatever families the test sets."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _requests_family(value: float | None) -> CounterMetricFamily:
    fam = CounterMetricFamily(C.REQUESTS.name, C.REQUESTS.help, labels=list(C.REQUESTS.labels))
    if value is not None:
        fam.add_metric(["code", "length"], value)
    return fam


def test_the_ring_wins_for_what_it_provides_and_keeps_it() -> None:
    view = parse_vllm_text(TWO_ENGINES)
    ring = FixedFamilies()
    compat = GaugeMetricFamily(C.REQUESTS_RUNNING.vllm_name, "compat copy", value=0.0)
    ring.families = [_requests_family(None), compat,
                     HistogramMetricFamily(C.TTFT.name, C.TTFT.help, labels=["task"], unit="seconds")]
    merged = MergedCollector(ring, lambda: view)

    def series(name: str) -> list:
        return [s for fam in merged.collect() if fam.name == name for s in fam.samples]

    # No ring data yet: the scraped requests are served; the compat copy of a scraped gauge is dropped.
    assert {s.labels["finish_reason"]: s.value for s in series(C.REQUESTS.name)} == {"length": 7.0, "stop": 1.0}
    assert series(C.REQUESTS_RUNNING.name)[0].value == 3.0 and not series(C.REQUESTS_RUNNING.vllm_name)
    # The ring provides requests: only its samples, never a sum with the scrape's.
    ring.families[0] = _requests_family(2.0)
    assert [(s.labels["task"], s.value) for s in series(C.REQUESTS.name)] == [("code", 2.0)]
    # Sticky: the ring's family empty again does not bring the scraped series back.
    ring.families[0] = _requests_family(None)
    assert series(C.REQUESTS.name) == []
    # Other families are still served from the scrape, each name exactly once.
    names = [fam.name for fam in merged.collect()]
    assert names.count(C.TTFT.name) == 1 and len(series(C.TTFT.name)) == 3 + 2  # 3 buckets, _count, _sum
    assert MergedCollector(ring, lambda: ScrapedView()).ring_owned == set()
