"""A real Prometheus server scrapes the agent while a tiny engine runs a workload; every catalogue
metric the workload produces must be queryable, and the numbers must agree with the agent's JSON
API and with the engine's own outputs."""
from __future__ import annotations

import time

import httpx
import pytest
from agent_workload import MAX_TOKENS
from prometheus_server import DEMO_RECORDER, measured_cpu_ceilings, requires_prometheus, scraped_workload

from infersight.agent.api import report
from infersight.exporters import catalogue as C

pytestmark = requires_prometheus
JOB = "infersight"

#: Catalogue metrics this workload legitimately leaves without a series (asserted absent, so this
#: list stays true). Everything else in the catalogue must have data.
NO_DATA = {
    C.ENERGY.name: "fed from the GPU's total-energy counter, and a CPU run has none (checked on a GPU host by "
                   "benchmarks/energy_check.py)",
    C.ENERGY_IDLE.name: "the same counter's energy between steps",
    C.PROBE_REJECTED.name: "a clean run sends no record the agent must refuse (tests/agent/test_record_limits.py "
                           "and the probe-record fuzz drive it)",
    # A CPU machine has no GPU telemetry source (the agent's status line says so).
    # (The error counter is present: the none collector reports zero errors.)
    **{spec.name: "no GPU on a CPU machine" for spec in C.GPU_METRICS if spec is not C.GPU_COLLECTOR_ERRORS},
}
#: Present, with value 0 by construction (asserted below).
ZERO = {
    "network phase": 'sum(infersight_request_phase_seconds_sum{phase="network"})',
    "dropped events": "sum(infersight_probe_events_dropped_total)",
    "corrupt events": "sum(infersight_probe_events_corrupt_total)",
}


class Prom:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, q: str) -> list[dict]:
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": q}, timeout=5)
        body = resp.json()
        assert resp.status_code == 200 and body["status"] == "success", (q, body)
        return body["data"]["result"]

    def value(self, q: str) -> float:
        result = self.query(q)
        assert len(result) == 1, (q, result)
        return float(result[0]["value"][1])


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """(Prom, workload, agent, probe) once Prometheus holds a scrape taken after the last event, this
    CPU's roofline ceilings measured first (as the dashboard test does)."""
    tmp = tmp_path_factory.mktemp("prometheus")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("INFERSIGHT_CEILINGS", str(measured_cpu_ceilings(tmp)))
        with scraped_workload(tmp, "prom", JOB, recorder=DEMO_RECORDER) as run:
            prom = Prom(run.url)
            got = prom.query(f'sum(infersight_requests_total{{job="{JOB}"}})')
            assert got and float(got[0]["value"][1]) == len(run.work.prompts)
            assert prom.value(f'up{{job="{JOB}"}}') == 1.0
            yield prom, run.work, run.agent, run.probe


def test_every_catalogue_metric_is_in_prometheus(scraped) -> None:
    prom, *_ = scraped
    missing, unexpected = [], []
    for spec in C.CATALOGUE:
        result = prom.query(f'{{__name__=~"{spec.sample}(_bucket|_sum|_count)?", job="{JOB}"}}')
        if spec.name in NO_DATA:
            if result:
                unexpected.append(spec.name)
        elif not result:
            missing.append(spec.name)
        else:
            for series in result:  # each series carries exactly the catalogue's labels
                labels = set(series["metric"]) - {"__name__", "job", "instance", "le"}
                assert labels == set(spec.exposed_labels), (spec.name, series["metric"])
    assert not missing, f"catalogue metrics without data in Prometheus: {missing}"
    assert not unexpected, f"these now have data; move them out of NO_DATA: {unexpected}"


def test_zero_valued_series_are_present(scraped) -> None:
    prom, work, *_ = scraped
    for what, q in ZERO.items():
        assert prom.value(q) == 0.0, what
    n = len(work.prompts)
    for phase in C.PHASES:  # every phase observed once per request, network included
        assert prom.value(f'sum(infersight_request_phase_seconds_count{{phase="{phase}"}})') == n, phase


def test_prometheus_agrees_with_json_api_and_engine(scraped) -> None:
    prom, work, agent, probe = scraped
    summary = report.summary(agent.state)
    outs = work.outputs
    n = len(outs)
    v = prom.value
    assert v("sum(infersight_requests_total)") == summary["requests"] == n
    assert v('sum(infersight_requests_total{finish_reason="length"})') == n
    for task in ("code", "json"):
        want = sum(1 for _, t in work.prompts.values() if t == task)
        assert v(f'sum(infersight_requests_total{{task="{task}"}})') == want
        assert v(f'sum(infersight_e2e_request_latency_seconds_count{{task="{task}"}})') == want
        assert v(f'sum(infersight_spec_draft_tokens_total{{task="{task}"}})') == \
            sum(o.num_spec_proposed for o in outs if o.task == task)
        assert v(f'sum(infersight_spec_accepted_tokens_total{{task="{task}"}})') == \
            sum(o.num_spec_accepted for o in outs if o.task == task)
    assert v("sum(infersight_time_to_first_token_seconds_count)") == n
    assert v('infersight_kv_block_events_total{event="evicted"}') == summary["kv"]["evictions"] > 0
    assert v('infersight_kv_block_events_total{event="offloaded"}') == summary["kv"]["offloads"]
    assert v('infersight_kv_block_events_total{event="reloaded"}') == summary["kv"]["reloads"]
    assert v("infersight_kv_recomputed_tokens_total") == summary["kv"]["recomputed_tokens"]
    assert v("sum(infersight_preemptions_total)") == summary["kv"]["preemptions"] == \
        sum(o.num_preemptions for o in outs) > 0
    assert v("sum(infersight_spec_draft_tokens_total)") == sum(o.num_spec_proposed for o in outs)
    assert v("sum(infersight_spec_accepted_tokens_total)") == sum(o.num_spec_accepted for o in outs) > 0
    assert v("sum(infersight_prompt_tokens_total)") == work.prompt_tokens()
    assert v("sum(infersight_prefix_cache_queried_tokens_total)") == work.prompt_tokens()
    assert v("sum(infersight_prefix_cache_hit_tokens_total)") == sum(o.num_cached_tokens for o in outs) > 0
    assert v("sum(infersight_prefix_cache_hit_requests_total)") == sum(1 for o in outs if o.num_cached_tokens)
    assert v("sum(infersight_generation_tokens_total)") == MAX_TOKENS * n
    assert v("infersight_steps_total") == len(work.steps)
    assert v("sum(infersight_step_duration_seconds_count)") == len(work.steps)
    for kind, attr in (("prefill", "num_prefill_tokens"), ("decode", "num_decode_tokens"),
                       ("spec", "num_spec_tokens")):
        assert v(f'infersight_step_tokens_total{{kind="{kind}"}}') == sum(getattr(s, attr) for s in work.steps)
    worked = sum(s.end_ns - s.start_ns for s in work.steps if s.batch) / 1e9
    assert v("sum(infersight_request_engine_seconds_total)") == pytest.approx(worked, abs=1e-6)
    # A CPU run reads no GPU energy counter: the energy families have no series at all (not 0).
    assert prom.query("infersight_energy_joules_total") == prom.query("infersight_energy_idle_joules_total") == []
    assert v("sum(infersight_kv_blocks)") == 16 == summary["kv"]["blocks_total"]
    assert v("infersight_kv_cache_usage_ratio") == 0.0 == summary["kv"]["blocks_in_use"]  # all done
    assert v("infersight_requests_running") == v("infersight_requests_waiting") == 0
    assert v("sum(infersight_slow_requests_total)") == sum(summary["slow_causes"].values()) > 0
    expert_tokens = v("sum(infersight_moe_expert_tokens_total)")
    fed = sum(n_tok for s in work.steps for _, n_tok in s.batch)
    assert expert_tokens == 2 * 2 * fed  # top_k experts per fed token, in each of the 2 layers
    stats = probe.ring.stats()
    assert v("sum(infersight_probe_events_total)") == stats["produced"] == stats["consumed"]
    for task, s in summary["spec"]["by_task"].items():
        assert v(f'infersight_spec_accept_rate{{task="{task}"}}') == pytest.approx(s["accept_rate"])


def test_exemplars_carry_the_engines_trace_ids(scraped) -> None:
    prom, work, agent, _ = scraped
    rows = {r["trace_id"]: r for r in agent.state.finished}
    now = time.time()
    for metric, column in (("infersight_e2e_request_latency_seconds_bucket", "e2e_s"),
                           ("infersight_time_to_first_token_seconds_bucket", "ttft_s")):
        resp = httpx.get(f"{prom.url}/api/v1/query_exemplars",
                         params={"query": metric, "start": now - 600, "end": now + 60}, timeout=5).json()
        assert resp["status"] == "success", resp
        exemplars = [e for series in resp["data"] for e in series["exemplars"]]
        assert exemplars, metric
        for e in exemplars:
            trace = e["labels"]["trace_id"]
            assert trace in work.trace_ids
            assert float(e["value"]) == pytest.approx(rows[trace][column], abs=1e-9)
