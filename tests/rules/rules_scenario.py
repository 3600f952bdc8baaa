"""What the alert tests share: the generated rule files, two agents' target labels (one sick, one
healthy beside it, so one run shows an alert firing and staying silent), and a promtool case."""
from __future__ import annotations

from pathlib import Path

from infersight.exporters.rules import RulesConfig, write_rules
from rules_annotations import expected, find_alert, load_alerts
from rules_promtool import assert_passes, test_rules

SICK = {"namespace": "llm", "job": "infersight", "instance": "10.0.0.7:9464", "pod": "vllm-0"}
HEALTHY = {"namespace": "llm", "job": "infersight", "instance": "10.0.0.8:9464", "pod": "vllm-1"}
RULE_FILES = ("infersight-recording.rules.yml", "infersight-alerts.rules.yml", "infersight-gpu.rules.yml")


def rule_files(out: Path, config: RulesConfig | None = None) -> list[Path]:
    write_rules(out, config or RulesConfig())
    return [out / name for name in RULE_FILES]


def run_case(tmp: Path, files: list[Path], input_series: list[dict], alertname: str,
             checks: list[tuple[str, list[tuple[dict[str, str], float | None]]]]) -> None:
    """checks: (eval time, [(labels of a firing alert, its value)]); every other series silent."""
    rule = find_alert(load_alerts(*files), alertname)
    tests = [{"eval_time": at, "alertname": alertname, "exp_alerts": [expected(rule, labels, value)
                                                                      for labels, value in firing]}
             for at, firing in checks]
    assert_passes(test_rules(tmp, files, [{"interval": "1m", "input_series": input_series,
                                           "alert_rule_test": tests}]))
