"""The engine alerts under `promtool test rules`: each fires for a sick agent's engine and stays
silent for a healthy one scraped beside it, on series named from the catalogue. Values and the
moment each fires are worked out by hand in the comments."""
from __future__ import annotations

from pathlib import Path

import pytest

from infersight.exporters import catalogue as C
from infersight.exporters.rules import RulesConfig
from rules_promtool import needs_promtool
from rules_scenario import HEALTHY, SICK, rule_files, run_case
from rules_series import counter_values, gauge_values, selector

pytestmark = needs_promtool


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return rule_files(tmp_path_factory.mktemp("engine_rules"))


def test_preemption_storm(files: list[Path], tmp_path: Path) -> None:
    # 600 steps a minute on both; the sick engine preempts 120 a minute (0.2 per step, over the
    # 0.125 storm), the healthy one 30 (0.05). "for: 5m": firing by 10m; at 4m still pending.
    series = [
        {"series": selector(C.STEPS.sample, SICK), "values": counter_values([(30, 600)])},
        {"series": selector(C.STEPS.sample, HEALTHY), "values": counter_values([(30, 600)])},
        {"series": selector(C.PREEMPTIONS.sample, {**SICK, "reason": "recompute"}), "values": counter_values([(30, 120)])},
        {"series": selector(C.PREEMPTIONS.sample, {**HEALTHY, "reason": "recompute"}), "values": counter_values([(30, 30)])},
    ]
    run_case(tmp_path, files, series, "InfersightPreemptionStorm", [("4m", []), ("10m", [(SICK, 120 / 600)])])


def test_kv_cache_pressure(files: list[Path], tmp_path: Path) -> None:
    # Sick: 98% of blocks in use with 3 requests waiting. Healthy: 50% in use. A third engine is
    # 99% full but nobody waits: a full cache that serves everyone is not pressure.
    full_idle = {**HEALTHY, "pod": "vllm-2", "instance": "10.0.0.9:9464"}
    series = []
    for labels, usage, waiting in ((SICK, 0.98, 3), (HEALTHY, 0.5, 0), (full_idle, 0.99, 0)):
        series += [{"series": selector(C.KV_USAGE.sample, labels), "values": gauge_values([(30, usage)])},
                   {"series": selector(C.REQUESTS_WAITING.sample, labels), "values": gauge_values([(30, waiting)])}]
    run_case(tmp_path, files, series, "InfersightKVCachePressure", [("5m", []), ("15m", [(SICK, 0.98)])])


def test_moe_imbalance(files: list[Path], tmp_path: Path) -> None:
    # Layer 3 of the sick engine: hottest expert 3.5x the mean (over 2). Its layer 0 (1.2x) and
    # the healthy engine (1.1x) stay silent, and so does a high cv: only max_over_mean is judged.
    series = [
        {"series": selector(C.MOE_IMBALANCE.sample, {**SICK, "layer": "3", "stat": "max_over_mean"}),
         "values": gauge_values([(30, 3.5)])},
        {"series": selector(C.MOE_IMBALANCE.sample, {**SICK, "layer": "0", "stat": "max_over_mean"}),
         "values": gauge_values([(30, 1.2)])},
        {"series": selector(C.MOE_IMBALANCE.sample, {**SICK, "layer": "0", "stat": "cv"}), "values": gauge_values([(30, 5.0)])},
        {"series": selector(C.MOE_IMBALANCE.sample, {**HEALTHY, "layer": "3", "stat": "max_over_mean"}),
         "values": gauge_values([(30, 1.1)])},
    ]
    run_case(tmp_path, files, series, "InfersightMoEImbalance", [("10m", []), ("20m", [({**SICK, "layer": "3"}, 3.5)])])


def test_speculation_acceptance_collapse(files: list[Path], tmp_path: Path) -> None:
    # Task code: 100 drafts a minute, 80 accepted for a day, then 20 for an hour. After k minutes
    # of collapse the 30m rate is 0.8 - 0.02k and the 1d rate about 0.78, so below half of it from
    # k=21 and firing from k=36 ("for: 15m"); at k=60 the 30m rate is 20/100. Task chat accepts
    # 60 of 100 throughout (30m rate = 1d rate): silent. 3000 drafts per 30m >= 200.
    series = []
    for task, before, after in (("code", 80, 20), ("chat", 60, 60)):
        labels = {**SICK, "task": task}
        series += [{"series": selector(C.SPEC_DRAFT.sample, labels), "values": counter_values([(1500, 100)])},
                   {"series": selector(C.SPEC_ACCEPTED.sample, labels),
                    "values": counter_values([(1440, before), (60, after)])}]
    run_case(tmp_path, files, series, "InfersightSpeculationAcceptanceCollapse",
             [("1470m", []), ("1500m", [({**SICK, "task": "code"}, 20 / 100)])])


def test_spec_collapse_needs_enough_drafts(tmp_path: Path) -> None:
    # The same collapse on 5 drafts a minute: 150 per 30m, under the 200 the rule asks for.
    files = rule_files(tmp_path / "rules", RulesConfig())
    labels = {**SICK, "task": "code"}
    series = [{"series": selector(C.SPEC_DRAFT.sample, labels), "values": counter_values([(1500, 5)])},
              {"series": selector(C.SPEC_ACCEPTED.sample, labels), "values": counter_values([(1440, 4), (60, 1)])}]
    run_case(tmp_path, files, series, "InfersightSpeculationAcceptanceCollapse", [("1500m", [])])


def test_flight_recorder_over_budget(files: list[Path], tmp_path: Path) -> None:
    # Both engines run 60 engine-seconds a minute with a 0.5% budget. The sick recorder costs 0.6
    # s a minute (1%: 2x its budget), the healthy one 0.15 s (0.25%). The 1h ratio is 2 from the
    # second minute on; "for: 15m": firing at 30m.
    series = []
    for labels, cost in ((SICK, 0.6), (HEALTHY, 0.15)):
        series += [{"series": selector(C.RECORDER_ENGINE.sample, labels), "values": counter_values([(60, 60)])},
                   {"series": selector(C.RECORDER_COST.sample, {**labels, "kind": "window"}),
                    "values": counter_values([(60, cost)])},
                   {"series": selector(C.RECORDER_BUDGET.sample, labels), "values": gauge_values([(60, 0.005)])}]
    run_case(tmp_path, files, series, "InfersightFlightRecorderOverBudget", [("30m", [(SICK, 0.01 / 0.005)])])


def test_engine_gc_stalls(files: list[Path], tmp_path: Path) -> None:
    # The sick engine's process stands still 5.4 s a minute in full collections and 0.6 s in young ones:
    # 10% of the time, summed over generations (over the 5% alert); the healthy one 0.6 s a minute in
    # full ones (1%). rate() over 10m divides by the whole window: at t minutes it reads about 0.1 x t / 10,
    # over 5% from about 5m (pending), "for: 10m": still pending at 15m, firing by 20m.
    series = [
        {"series": selector(C.HOST_PAUSE_SECONDS.sample, {**SICK, "generation": "2"}), "values": counter_values([(30, 5.4)])},
        {"series": selector(C.HOST_PAUSE_SECONDS.sample, {**SICK, "generation": "0"}), "values": counter_values([(30, 0.6)])},
        {"series": selector(C.HOST_PAUSE_SECONDS.sample, {**HEALTHY, "generation": "2"}),
         "values": counter_values([(30, 0.6)])},
    ]
    run_case(tmp_path, files, series, "InfersightEngineGCStalls", [("4m", []), ("15m", []), ("20m", [(SICK, 0.1)])])
