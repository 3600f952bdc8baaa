"""The generated rule files: promtool accepts them, the PrometheusRule holds the same groups, every
series they name is a catalogue family (or dcgm-exporter's), recording rules are named
level:metric:operations, every alert has its severity and annotations, its runbook names panels
the dashboards have and endpoints the agent serves, and every alert has a promtool scenario."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from infersight.agent.recorder.config import RecorderConfig
from infersight.correlate.moe import IMBALANCE_COLUMNS
from infersight.exporters import catalogue as C
from infersight.exporters.rules import RulesConfig, runbook, write_rules
from infersight.exporters.rules.dcgm import DCGM_SERIES
from infersight.exporters.rules.engine_alerts import MAX_OVER_MEAN
from infersight.exporters.rules.files import PROMETHEUS_RULE
from rules_promtool import check_rules, needs_promtool

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {"default": RulesConfig(),
           "custom": RulesConfig(slo_ttft_s=0.25, slo_itl_s=0.02, slo_e2e_s=5.0, slo_target=0.995,
                                 agent_selector='job="infersight", namespace=~"llm-.*"')}
#: The alerts tests/rules' promtool scenarios fire (written by hand from those files): an alert
#: added to the generator without a scenario fails test_every_alert_has_a_scenario.
SCENARIOS = {
    "InfersightTimeToFirstTokenBudgetBurn", "InfersightInterTokenLatencyBudgetBurn",
    "InfersightEndToEndLatencyBudgetBurn",  # test_rules_slo_alerts.py
    "InfersightPreemptionStorm", "InfersightKVCachePressure", "InfersightMoEImbalance",
    "InfersightSpeculationAcceptanceCollapse", "InfersightFlightRecorderOverBudget",
    "InfersightEngineGCStalls",  # test_rules_engine_alerts.py
    "InfersightAgentDown", "InfersightAgentAbsent", "InfersightNoProbeRing", "InfersightProbeRingGone",
    "InfersightEngineDied", "InfersightProbeEventsDropped", "InfersightProbeEventsLost",  # test_rules_agent_alerts.py
    "InfersightGpuXidError", "InfersightGpuThermalThrottling", "InfersightGpuPowerThrottling",  # test_rules_gpu_alerts.py
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_rules(tmp_path_factory.mktemp(f"rules_{request.param}"), CONFIGS[request.param])


def _rule_files(paths: list[Path]) -> list[Path]:
    return [p for p in paths if p.name.endswith(".rules.yml")]


def _rules(paths: list[Path]) -> list[dict]:
    return [r for p in _rule_files(paths) for g in yaml.safe_load(p.read_text())["groups"] for r in g["rules"]]


@needs_promtool
def test_promtool_accepts_every_file(written: list[Path]) -> None:
    result = check_rules(*_rule_files(written))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 4


def test_prometheus_rule_holds_the_same_groups(written: list[Path]) -> None:
    resource = yaml.safe_load((written[0].parent / PROMETHEUS_RULE).read_text())
    assert (resource["apiVersion"], resource["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    groups = [g for p in _rule_files(written) for g in yaml.safe_load(p.read_text())["groups"]]
    assert resource["spec"]["groups"] == groups
    assert len({g["name"] for g in groups}) == len(groups)


def test_every_series_is_named_by_the_catalogue(written: list[Path]) -> None:
    families = {m.name for m in C.CATALOGUE + C.AGENT_SERVICE_METRICS}  # the agent serves both
    dcgm = {s.name for s in DCGM_SERIES}
    recorded = {r["record"] for r in _rules(written) if "record" in r}
    record_name = r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b"
    for rule in _rules(written):
        for token in re.findall(record_name, rule["expr"]):
            assert token in recorded, f"{token} is read but never recorded"
        for token in re.findall(r"\binfersight_[a-z0-9_]+", re.sub(record_name, "", rule["expr"])):
            family = re.sub(r"(_total|_bucket|_count|_sum)$", "", token)
            assert family in families, f"{token} in {rule.get('record') or rule.get('alert')} is not a catalogue family"
        for token in re.findall(r"\bDCGM_[A-Z_]+", rule["expr"]):
            assert token in dcgm


def test_recording_rules_are_level_metric_operations(written: list[Path]) -> None:
    families = {m.name for m in C.CATALOGUE + C.AGENT_SERVICE_METRICS}  # the agent serves both
    names = [r["record"] for r in _rules(written) if "record" in r]
    assert len(names) == len(set(names)) or all(  # quantiles share a name, told apart by their label
        names.count(n) == 3 for n in names if n.endswith(":histogram_quantile"))
    for name in names:
        level, metric, operations = name.split(":")
        assert level and operations and ":" not in operations
        assert any(metric == f or metric.startswith(f + "_") for f in families), name


def test_every_alert_has_severity_summary_description_runbook(written: list[Path]) -> None:
    alerts = [r for r in _rules(written) if "alert" in r]
    assert alerts
    for a in alerts:
        assert a["labels"]["severity"] in ("critical", "warning", "info"), a["alert"]
        assert set(a["annotations"]) == {"summary", "description", "runbook"}, a["alert"]
        text = a["annotations"]["runbook"]
        assert "/d/infersight-" in text, a["alert"]  # a dashboard to open
        assert any(e.split("?")[0] in text for e in runbook.ENDPOINTS), a["alert"]  # an agent endpoint to read
        if not a["expr"].startswith("absent(") and a["alert"] != "InfersightNoProbeRing":
            assert "$value" in a["annotations"]["description"], a["alert"]


def test_every_alert_has_a_scenario(written: list[Path]) -> None:
    assert {r["alert"] for r in _rules(written) if "alert" in r} == SCENARIOS


def test_runbook_panels_are_the_dashboards_panels() -> None:
    from infersight.dashboards.grafana import build_dashboards

    boards = build_dashboards()
    panels = [v for v in vars(runbook).values() if isinstance(v, runbook.Panel)]
    assert len(panels) >= 10
    for p in panels:
        board = boards[p.dashboard_uid]
        assert board.title == p.dashboard_title
        assert p.title in [panel.title for panel in board.panels or []], f"no panel {p.title!r} in {p.dashboard_uid}"


def test_runbook_endpoints_are_agent_routes() -> None:
    source = (REPO / "infersight" / "agent" / "api" / "server.py").read_text()
    for endpoint in runbook.ENDPOINTS:
        assert f'Route("{endpoint.split("?")[0]}"' in source, endpoint


def test_default_selector_is_the_deployed_agents_container() -> None:
    """deploy/kubernetes runs the agent as a container whose port `infersight` Prometheus scrapes;
    the default selector names that container, and the plain scrape config keeps the label."""
    wanted = dict(re.findall(r'(\w+)="([^"]*)"', RulesConfig().agent_selector))
    deployments = sorted((REPO / "deploy" / "kubernetes").glob("*/deployment.yaml"))
    if not deployments:
        pytest.skip("no deploy/kubernetes manifests in this checkout")
    for path in deployments:
        pod = next(d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Deployment")
        spec = pod["spec"]["template"]["spec"]
        agents = [c["name"] for c in spec.get("initContainers", []) + spec["containers"]
                  if any(p.get("name") == "infersight" for p in c.get("ports", []))]
        assert agents == [wanted["container"]], path
    scrape = (REPO / "deploy" / "kubernetes" / "prometheus" / "prometheus.yml").read_text()
    assert "target_label: container" in scrape


def test_thresholds_agree_with_the_agent() -> None:
    """The storm rate is the flight recorder's trigger (preemptions within steps), and the MoE
    statistic judged is one the agent computes per layer."""
    recorder = RecorderConfig()
    assert RulesConfig().preemptions_per_step == recorder.preemption_storm / recorder.storm_steps
    assert MAX_OVER_MEAN in IMBALANCE_COLUMNS


def test_flags_reach_the_rules(tmp_path: Path) -> None:
    """The custom objectives reach the SLI's bucket matchers, the target its budget, the selector
    the up/absent alerts."""
    write_rules(tmp_path, CONFIGS["custom"])
    slo = (tmp_path / "infersight-slo.rules.yml").read_text()
    assert r'time_to_first_token_seconds_bucket{le=~"0\\.25"}' in slo
    assert r'inter_token_latency_seconds_bucket{le=~"0\\.02"}' in slo
    assert r'e2e_request_latency_seconds_bucket{le=~"5|5\\.0"}' in slo
    assert re.findall(r"/ ([0-9.]+) > 14\.4", slo) == ["0.005"] * 6  # 3 objectives, long and short window
    alerts = (tmp_path / "infersight-alerts.rules.yml").read_text()
    assert 'absent(up{job=\\"infersight\\", namespace=~\\"llm-.*\\"})' in alerts
