"""The agent and probe alerts under `promtool test rules`: the agent down or absent, an agent that
reads no ring or fewer rings than before, an engine that died without closing its ring, probe
events dropped or lost. Each fires for the sick
agent and stays silent for the healthy one beside it; the numbers are worked out in comments."""
from __future__ import annotations

from pathlib import Path

import pytest

from infersight.exporters import catalogue as C
from rules_promtool import needs_promtool
from rules_scenario import HEALTHY, SICK, rule_files, run_case
from rules_series import counter_values, gauge_values, selector

pytestmark = needs_promtool


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return rule_files(tmp_path_factory.mktemp("agent_rules"))


#: The agent's container as deploy/kubernetes names it: the default agent selector matches it.
AGENT = {"container": "infersight-agent"}


def _up(labels: dict[str, str], minutes: int, value: float) -> dict[str, str]:
    """An agent target's `up` (other targets pass their own container)."""
    return {"series": selector("up", {**AGENT, **labels}), "values": gauge_values([(minutes, value)])}


def _ring(labels: dict[str, str], ring: str, values: str) -> dict[str, str]:
    return {"series": selector(C.PROBE_EVENTS.sample, {**labels, "ring": ring}), "values": values}


def test_agent_down(files: list[Path], tmp_path: Path) -> None:
    # The sick agent fails every scrape (up 0: 0% over 10m); the healthy one answers all. Also a
    # down target of another container in the same pod (vLLM's own port): not the agent's.
    # "for: 5m" from the first evaluation: firing at 10m.
    other = {**SICK, "container": "vllm"}
    series = [_up(SICK, 30, 0), _up(HEALTHY, 30, 1), _up(other, 30, 0)]
    run_case(tmp_path, files, series, "InfersightAgentDown", [("3m", []), ("10m", [({**SICK, **AGENT}, 0.0)])])


def test_agent_absent(files: list[Path], tmp_path: Path) -> None:
    # No target matches the agent selector (only vLLM's own port is scraped): absent() gives one
    # series carrying the selector's equality matchers (container="infersight-agent").
    # "for: 15m": firing at 20m, not at 10m.
    series = [_up({**SICK, "container": "vllm"}, 30, 1)]
    run_case(tmp_path, files, series, "InfersightAgentAbsent", [("10m", []), ("20m", [(AGENT, None)])])


def test_agent_present_is_not_absent(files: list[Path], tmp_path: Path) -> None:
    # Whatever the job is called (the operator names it "<namespace>/<podmonitor>"), the agent's
    # container is what the default selector matches.
    series = [_up({**SICK, "job": "llm/vllm-infersight"}, 30, 1)]
    run_case(tmp_path, files, series, "InfersightAgentAbsent", [("20m", [])])


def test_no_probe_ring(files: list[Path], tmp_path: Path) -> None:
    # Both agents are up; only the healthy one reads a ring. "for: 15m": firing at 20m.
    series = [_up(SICK, 30, 1), _up(HEALTHY, 30, 1), _ring(HEALTHY, "infersight-41", counter_values([(30, 50)]))]
    run_case(tmp_path, files, series, "InfersightNoProbeRing", [("10m", []), ("20m", [(SICK, None)])])


def test_probe_ring_gone(files: list[Path], tmp_path: Path) -> None:
    # The sick agent reads rings r1 and r2 for 30 minutes, then r2 ends (a stale marker at 31m).
    # The healthy agent's engine restarts at 30m: its ring r3 ends and r4 begins, one ring
    # throughout. At 35m the sick agent read 2 rings 10 minutes ago and 1 now: firing, value 2.
    # At 45m both windows see one ring: resolved.
    series = [_up(SICK, 50, 1), _up(HEALTHY, 50, 1),
              _ring(SICK, "r1", counter_values([(50, 10)])),
              _ring(SICK, "r2", counter_values([(30, 10)]) + " stale"),
              _ring(HEALTHY, "r3", counter_values([(30, 10)]) + " stale"),
              _ring(HEALTHY, "r4", "_x30 " + counter_values([(20, 10)]))]
    run_case(tmp_path, files, series, "InfersightProbeRingGone", [("25m", []), ("35m", [(SICK, 2)]), ("45m", [])])


def test_engine_died(files: list[Path], tmp_path: Path) -> None:
    # The sick agent's engine is killed at 20m: the counter of dead rings steps 0 -> 1 (its successor
    # writes a new ring: the ring count never drops). Over 15 minutes: 1 at 25m; out of the window at
    # 40m. The healthy agent counts none.
    series = [{"series": selector(C.PROBE_RINGS_DEAD.sample, SICK), "values": "0x20 1x20"},
              {"series": selector(C.PROBE_RINGS_DEAD.sample, HEALTHY), "values": "0x40"}]
    run_case(tmp_path, files, series, "InfersightEngineDied", [("15m", []), ("25m", [(SICK, 1.0)]), ("40m", [])])


def test_probe_events_dropped(files: list[Path], tmp_path: Path) -> None:
    # The sick engine drops 30 slots a minute on its ring (0.5/s); the healthy one none.
    # "for: 5m": firing at 12m.
    series = [{"series": selector(C.PROBE_DROPPED.sample, {**SICK, "ring": "r1"}), "values": counter_values([(30, 30)])},
              {"series": selector(C.PROBE_DROPPED.sample, {**HEALTHY, "ring": "r2"}), "values": counter_values([(30, 0)])}]
    run_case(tmp_path, files, series, "InfersightProbeEventsDropped", [("12m", [({**SICK, "ring": "r1"}, 0.5)])])


def test_probe_events_lost(files: list[Path], tmp_path: Path) -> None:
    # A successor agent counts 7 events lost at 21m (the counter steps 0 -> 7). Over 15 minutes:
    # 7 lost at 30m; none left in the window at 40m. The healthy ring never loses any.
    series = [{"series": selector(C.PROBE_LOST.sample, {**SICK, "ring": "r1"}), "values": "0x20 7x20"},
              {"series": selector(C.PROBE_LOST.sample, {**HEALTHY, "ring": "r2"}), "values": "0x40"}]
    run_case(tmp_path, files, series, "InfersightProbeEventsLost",
             [("30m", [({**SICK, "ring": "r1"}, 7.0)]), ("40m", [])])
