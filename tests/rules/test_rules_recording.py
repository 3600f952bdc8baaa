"""The recording rules compute what the dashboards' queries compute: on one built service, each
recorded series equals the dashboard's own query (its $__rate_interval at the rules' 5 minutes)
and a value worked out by hand."""
from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.utils import floatToGoString

from infersight.exporters import catalogue as C
from infersight.exporters.rules import RulesConfig
from infersight.exporters.rules.expressions import record_name
from rules_promtool import assert_passes, needs_promtool, test_rules
from rules_scenario import SICK, rule_files
from rules_series import counter_values, histogram_series, selector

pytestmark = needs_promtool
SERVICE = {"namespace": SICK["namespace"], "job": SICK["job"]}


def _dashboard(query: str) -> str:
    return query.replace("$__rate_interval", "5m")


def _rounded(expr: str) -> str:
    """promtool compares floats exactly; a rate of whole numbers can be one ulp off a decimal, so
    both sides are rounded to 1e-6 (Go: floor(v * 1e6 + 0.5) / 1e6, as Python's round gives here)."""
    return f"round({expr}, 0.000001)"


def test_recorded_series_equal_the_dashboards_queries(tmp_path: Path) -> None:
    config = RulesConfig()
    svc = config.service_labels
    files = rule_files(tmp_path / "rules", config)
    chat = {**SICK, "task": "chat"}
    # TTFT: per minute 60 observations at 0.1 s and 40 at 1 s (buckets le=0.1 and le=1). p50 lies
    # in (0.075, 0.1]: 0.075 + 0.025 * 0.5/0.6; p99 in (0.75, 1]: 0.75 + 0.25 * (0.99-0.6)/0.4.
    series = histogram_series(C.TTFT, chat, [(30, 60, 40)], 0.1, 1.0, floatToGoString)
    # Phases: 3 s of queue and 9 s of decode per minute: 0.05 and 0.15 s per s.
    for phase, per_min in (("queue", 3.0), ("decode", 9.0)):
        series.append({"series": selector(C.PHASE.name + "_sum", {**chat, "phase": phase}),
                       "values": counter_values([(30, per_min)])})
    # Speculation: 50 of 200 drafts accepted a minute (0.25); prefix cache: 300 of 1200 prompt tokens hit.
    series += [{"series": selector(C.SPEC_DRAFT.sample, chat), "values": counter_values([(30, 200)])},
               {"series": selector(C.SPEC_ACCEPTED.sample, chat), "values": counter_values([(30, 50)])},
               {"series": selector(C.PREFIX_QUERIED.sample, chat), "values": counter_values([(30, 1200)])},
               {"series": selector(C.PREFIX_HIT.sample, chat), "values": counter_values([(30, 300)])}]
    at = "20m"
    p50, p99 = 0.075 + 0.025 * 0.5 / 0.6, 0.75 + 0.25 * (0.99 - 0.6) / 0.4
    quantile = record_name(svc + ("quantile",), C.TTFT.name, "histogram_quantile")
    accept = record_name(config.target_labels + ("task",), "infersight_spec_accepted_tokens_per_spec_draft_tokens",
                         "ratio_rate30m")
    checks = [
        (f'{quantile}{{quantile="0.5"}}', {**SERVICE, "quantile": "0.5"}, p50, _dashboard(C.TTFT.views["p50"])),
        (f'{quantile}{{quantile="0.99"}}', {**SERVICE, "quantile": "0.99"}, p99, _dashboard(C.TTFT.views["p99"])),
        (record_name(svc + ("phase",), C.PHASE.name + "_sum", "rate5m") + '{phase="decode"}',
         {**SERVICE, "phase": "decode"}, 0.15, None),
        (record_name(svc, "infersight_prefix_cache_hit_tokens_per_prefix_cache_queried_tokens", "ratio_rate5m"),
         SERVICE, 0.25, _dashboard(C.PREFIX_HIT.views["token_hit_rate"])),
        (accept, {**SICK, "task": "chat"}, 0.25, None),
    ]
    tests = []
    for expr, labels, value, dashboard in checks:
        tests.append({"expr": _rounded(expr), "eval_time": at,
                      "exp_samples": [{"labels": selector("", labels), "value": round(value, 6)}]})
        if dashboard:  # the dashboard's query: the same number, summed over everything
            tests.append({"expr": _rounded(dashboard), "eval_time": at,
                          "exp_samples": [{"labels": "{}", "value": round(value, 6)}]})
    tests.append({"expr": _rounded(_dashboard(C.PHASE.views["share"])) + ' and on (phase) {phase="decode"}',
                  "eval_time": at, "exp_samples": [{"labels": '{phase="decode"}', "value": 0.15}]})
    assert_passes(test_rules(tmp_path, files, [{"interval": "1m", "input_series": series,
                                                "promql_expr_test": tests}]))
