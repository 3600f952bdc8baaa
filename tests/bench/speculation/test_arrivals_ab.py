"""bench_speculation_on_arrivals with its observed arms, on a few of the demo's requests: every arm serves the
same work, and each observed arm's own records (its probe ring) count the steps the client timed."""
from __future__ import annotations

from dataclasses import replace

import pandas as pd
from testkit import one_torch_thread

from infersight.bench.speculation.arrivals_ab import OBSERVED_ARMS, bench_speculation_on_arrivals
from infersight.demo import DemoConfig, demo_engine_config
from infersight.workload import WorkloadConfig, build_workload


def test_observed_arms_are_measured_and_their_records_count_the_timed_steps(tmp_path) -> None:
    demo = DemoConfig(device="cpu")
    workload = [replace(r, max_tokens=min(r.max_tokens, 12))
                for r in build_workload(WorkloadConfig(num_requests=12, rate_per_s=demo.rate_per_s, max_tokens=12,
                                                       seed=demo.seed))]
    with one_torch_thread():
        result = bench_speculation_on_arrivals(demo_engine_config(demo, "cpu"), workload, rounds=1,
                                               warmup_requests=2, frames_out=str(tmp_path), observed_arms=True)
    tasks = [k.split(".")[0] for k in result if k.endswith(".measured_speedup")]
    assert tasks and result["tasks"] == len(tasks)
    for task in tasks:
        assert result[f"{task}.measured_speedup_observed"] > 0
        assert len(result[f"{task}.measured_rounds_observed"]) == 1
    assert 0 <= result["tasks_inside_observed"] <= len(tasks)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert set(steps["arm"]) == {"plain", "spec", "probed", *OBSERVED_ARMS}
    for arm in OBSERVED_ARMS:
        timed = steps[steps["arm"] == arm]
        recorded = pd.read_parquet(tmp_path / f"{arm}_step_timing.parquet")
        # The client timed every step that ran requests; the observer recorded each step it ended.
        assert len(recorded) == len(timed) == sum(v["steps"] for v in result[f"{arm}.steps_by_kind"].values())
        # Requests in each step, by the observer's records (decoding requests, + 1 per prefill chunk at most)
        # and by the client's count, agree on the pure-decode steps, in order.
        decode_only = recorded[recorded["prefill_tokens"] == 0]["decode_requests"].tolist()
        assert decode_only == timed[timed["kind"] == "decode"]["batch"].tolist()


def test_under_async_scheduling_the_arms_run_alone_and_probe_runs_are_launched_ahead(tmp_path) -> None:
    """The CPU runs async scheduling's launches and reads (without overlap): the arms run one after another
    (fixed_batch.step_runs), which the observers' clocks show, and the probed engine's plain probe runs
    give steady async steps (launched ahead, launching ahead), the only ones the plain step is priced by."""
    demo = DemoConfig(device="cpu")
    workload = [replace(r, max_tokens=min(r.max_tokens, 24))
                for r in build_workload(WorkloadConfig(num_requests=12, rate_per_s=demo.rate_per_s, max_tokens=24,
                                                       seed=demo.seed))]
    config = replace(demo_engine_config(demo, "cpu"), async_scheduling=True, spec_probe_run=0)
    with one_torch_thread():
        result = bench_speculation_on_arrivals(config, workload, rounds=1, warmup_requests=2,
                                               frames_out=str(tmp_path), observed_arms=True)
    probed = pd.read_parquet(tmp_path / "step_timing.parquet")
    spans = {"probed": probed, **{arm: pd.read_parquet(tmp_path / f"{arm}_step_timing.parquet")
                                  for arm in OBSERVED_ARMS}}
    bounds = sorted((t["start_ns"].min(), t["end_ns"].max()) for t in spans.values())
    assert all(end <= start for (_, end), (start, _) in zip(bounds, bounds[1:]))  # no two arms interleave
    probes = probed[probed["spec_probe"] & (probed["prefill_tokens"] == 0)]
    steady = probes[probes["launched_ahead"] & probes["launched_next"]]
    assert len(steady) > 0 and (~probes["launched_ahead"] & probes["launched_next"]).any()  # and runs' first steps
    assert not probed.loc[~probed["spec_probe"], "launched_ahead"].any()  # speculative steps run synchronously
    assert result["tasks"] > 0
