"""Energy per request through the whole agent: a real tiny engine, the agent's GPU sampler over the
real NvmlCollector and a fake pynvml whose energy counter the test advances between polls. The
requests' joules together are checked against a naive reference built from the engine's own
StepStats and the readings the sampler took (each step's energy, exactly); the per-request joules
plus idle equal the counter's rise exactly. How each step is split between its requests is checked
against a known answer in test_energy_known_answer.py."""
from __future__ import annotations

import json
import sys
import time
from fractions import Fraction
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from agent_workload import make_engine, run_workload, unique_ring
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from gpu_fakes import FakeGpuState, FakeNvml  # noqa: E402

from infersight.agent.api import report  # noqa: E402
from infersight.agent.config import AgentConfig  # noqa: E402
from infersight.agent.gpu_config import GpuConfig  # noqa: E402
from infersight.agent.service import Agent  # noqa: E402
from infersight.gpu.nvml_collector import NvmlCollector  # noqa: E402

#: The fake GPU draws between 250 and 450 W, changing with every reading.
WATTS = (250, 450, 320, 400, 290)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The workload with a GPU reading every third engine step (coarser than steps, as in life)."""
    ring, out = unique_ring("energy"), tmp_path_factory.mktemp("energy")
    gpu = FakeGpuState(uuid="GPU-fake-0", energy_mj=7_000_000_000)
    last = [time.monotonic_ns(), 0]  # when the counter last moved, readings so far

    def read_gpu() -> None:
        """Advance the counter by this interval's power (W x ns = nJ; / 1e6 -> mJ), then read it."""
        now = time.monotonic_ns()
        gpu.energy_mj += (now - last[0]) * WATTS[last[1] % len(WATTS)] // 1_000_000
        last[0], last[1] = now, last[1] + 1
        agent.gpu.poll_once()

    engine, probe = make_engine(ring)
    # The fake counter moves with the work (no lag), read at each poll: its intervals are fitted as they are.
    agent = Agent(AgentConfig(rings=[ring], port=0, parquet_dir=str(out), gpu=GpuConfig(energy_fit_min_s=0.0)),
                  gpu_collector=NvmlCollector(FakeNvml([gpu]), gpm=False))
    polls = [0]

    def poll() -> None:
        polls[0] += 1
        if polls[0] % 3 == 0:
            read_gpu()
        agent.poll_once()

    try:
        read_gpu()  # the account starts before the first step
        work = run_workload(engine, poll)
        gpu.energy_mj += 1234  # the last reading is the sampler's final one, at close
        agent.close()  # the sampler's final reading, then every held row
        yield work, agent, out
    finally:
        agent.close()
        probe.close()


def _energy_readings(agent: Agent) -> list[tuple[int, int]]:
    return [(s.ts_ns, round(s.value * 1e6)) for s in agent.gpu.recent() if s.field == "energy_joules"]


def _counter(readings: list[tuple[int, int]], t: int) -> int:
    for (t0, e0), (t1, e1) in zip(readings, readings[1:]):
        if t0 <= t <= t1:
            return round(e0 + Fraction(e1 - e0) * (t - t0) / (t1 - t0))
    raise AssertionError(f"{t} is outside the readings")


def test_the_requests_together_get_their_steps_naive_joules(run) -> None:
    work, agent, out = run
    readings = _energy_readings(agent)
    assert len(readings) >= 5
    in_steps = 0
    for st in work.steps:  # the engine's own record of each step: window and members
        if st.batch:
            in_steps += _counter(readings, st.end_ns) - _counter(readings, st.start_ns)
    rows = {r["request_id"]: r for r in agent.state.finished}
    assert sorted(rows) == sorted(work.prompts)
    assert sum(round(r["energy_j"] * 1e6) for r in rows.values()) == in_steps
    parquet = pq.read_table(out / "requests.parquet").to_pandas().set_index("request_id")
    assert all(round(parquet.loc[rid, "energy_j"] * 1e6) == round(r["energy_j"] * 1e6) for rid, r in rows.items())
    assert all(parquet.loc[rid, "energy_sampling_bound_j"] == r["energy_sampling_bound_j"] >= 0
               for rid, r in rows.items())
    schema = pq.read_schema(out / "requests.parquet")
    assert schema.field("energy_j").metadata[b"doc"].startswith(b"modelled split of measured energy")
    # Each step is split by modelled cost once the step-time fit is usable, and the summary says so.
    meter = agent.state.energy
    assert meter.costs.usable and meter.steps_by_model > 0
    # Once the fit is usable each row's joules are cut into dynamic + static, exactly (in uJ), and the
    # meter's totals with the part split before the fit add up to the requests' joules.
    cut = [r for r in rows.values() if r["energy_dynamic_j"] == r["energy_dynamic_j"]]
    assert cut and all(round(r["energy_dynamic_j"] * 1e6) + round(r["energy_static_j"] * 1e6)
                       == round(r["energy_j"] * 1e6) and r["energy_static_j"] >= 0 for r in cut)
    assert all(parquet.loc[r["request_id"], "energy_dynamic_j"] == r["energy_dynamic_j"] for r in cut)
    assert schema.field("energy_static_j").metadata[b"doc"].startswith(b"modelled split of measured energy")
    energy = report.summary(agent.state)["cost"]["energy"]
    assert energy["dynamic_j"] + energy["static_j"] + energy["unsplit_j"] == pytest.approx(energy["requests_j"])


def test_requests_plus_idle_is_the_counters_rise_exactly(run) -> None:
    _, agent, _ = run
    readings = _energy_readings(agent)
    meter = agent.state.energy
    assert meter.requests_uj + meter.idle_uj == readings[-1][1] - readings[0][1]
    assert meter.requests_uj == round(sum(r["energy_j"] * 1e6 for r in agent.state.finished))
    energy = report.summary(agent.state)["cost"]["energy"]
    assert energy["measured"] and energy["gpus"] == [0] and energy["basis"] == "modelled split of measured energy"
    assert energy["status"].startswith("energy_j is a modelled split of measured energy. Measured: ")
    assert energy["headline"].startswith(f"{energy['requests_j']:.1f} J in requests' steps (modelled split of "
                                         f"measured energy), {energy['idle_j']:.1f} J idle")
    slowest = report.slowest(agent.state, 3)
    assert all(r["energy_basis"] == "modelled split of measured energy" for r in slowest)
    assert energy["requests_j"] + energy["idle_j"] == pytest.approx(energy["counter_delta_j"], abs=1e-9)
    assert energy["counter_delta_j"] == (readings[-1][1] - readings[0][1]) / 1e6


def test_energy_metrics_are_fed(run) -> None:
    work, agent, _ = run
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(agent.registry).decode())}
    by_task = {s.labels["task"]: s.value for s in families["infersight_energy_joules"].samples
               if s.name.endswith("_total")}
    rows = list(agent.state.finished)
    for task in ("code", "json"):
        assert by_task[task] == pytest.approx(sum(r["energy_j"] for r in rows if r["task"] == task), rel=1e-12)
    idle = [s.value for s in families["infersight_energy_idle_joules"].samples if s.name.endswith("_total")]
    assert idle == [pytest.approx(agent.state.energy.idle_uj / 1e6, rel=1e-12)]
    # No GPM on this fake: the SM-active figure is absent, not 0.
    assert all(r["gpu_sm_active_s"] != r["gpu_sm_active_s"] for r in rows)


def test_gpu_readings_go_to_events_gpu_parquet_for_the_report(run) -> None:
    """The report's GPU figure reads events/gpu.parquet: the agent writes every reading it took."""
    _, agent, out = run
    written = pq.read_table(out / "events" / "gpu.parquet").to_pandas()
    energy = written[written["field"] == "energy_joules"]
    assert [(int(t), round(v * 1e6)) for t, v in zip(energy["ts_ns"], energy["value"])] == _energy_readings(agent)
    from infersight.dashboards.report.inputs import load_run

    (out / "summary.json").write_text(json.dumps(report.summary(agent.state)))
    run_data = load_run(out)
    assert run_data.gpu_samples is not None and len(run_data.gpu_samples) == len(written)
