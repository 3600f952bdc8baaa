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
