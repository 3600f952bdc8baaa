"""RulesConfig's checks, the SLI's bucket matcher against the agent's real exposition, and the YAML
writer against a YAML parser."""
from __future__ import annotations

import re

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import generate_latest

from infersight.exporters import catalogue as C
from infersight.exporters.rules import RulesConfig, build_groups
from infersight.exporters.rules.expressions import le_matcher
from infersight.exporters.rules.yaml_text import dump


def _exposed_bounds(spec: C.MetricSpec) -> list[str]:
    """The le values the agent's /metrics carries for a histogram (prometheus_client's text)."""
    class One:
        def collect(self):
            buckets = [(str(b), 0) for b in spec.buckets or ()] + [("+Inf", 0)]
            yield HistogramMetricFamily(spec.name, spec.help, buckets=buckets, sum_value=0)

    registry = CollectorRegistry()
    registry.register(One())
    return re.findall(r'le="([^"]+)"', generate_latest(registry).decode())


@pytest.mark.parametrize("spec", [C.TTFT, C.ITL, C.E2E], ids=lambda s: s.name)
def test_le_matcher_picks_exactly_the_objectives_bucket(spec: C.MetricSpec) -> None:
    exposed = _exposed_bounds(spec)
    assert len(exposed) == len(spec.buckets or ()) + 1
    for bound, text in zip(spec.buckets or (), exposed):
        pattern = json_string(le_matcher(bound))
        # the agent's spelling ("10.0") and Prometheus 3's normalised one ("10"), and no other bucket
        normalised = format(float(text), "g")
        assert re.fullmatch(pattern, text) and re.fullmatch(pattern, normalised), (bound, text)
        assert [t for t in exposed if re.fullmatch(pattern, t)] == [text]


def json_string(matcher: str) -> str:
    """The regex inside le=~"..." (a PromQL double-quoted string, JSON's escapes)."""
    import json

    return json.loads(matcher.removeprefix("le=~"))


@pytest.mark.parametrize("kwargs, message", [
    ({"slo_ttft_s": 0.3}, "nearest bounds: 0.25, 0.5"),
    ({"slo_itl_s": 0.05}, "nearest bounds: 0.04, 0.06"),
    ({"slo_e2e_s": 100.0}, "nearest bounds: 80"),
    ({"slo_ttft_s": -1.0}, "positive"),
    ({"slo_target": 1.0}, "--slo-target"),
    ({"slo_target": 0.99999}, "no error budget"),
    ({"agent_selector": "job="}, "--agent-selector"),
    ({"agent_selector": 'job="a" or 1'}, "--agent-selector"),
    ({"service_labels": ("job", "bad-label")}, "service_labels"),
    ({"kv_usage_ratio": 1.5}, "kv_usage_ratio"),
])
def test_config_refuses(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RulesConfig(**kwargs)


def test_config_accepts_several_matchers() -> None:
    RulesConfig(agent_selector='job="infersight", namespace=~"a,b", pod!="x"')


def test_yaml_writer_reads_back_as_written() -> None:
    """Every group dict, written by the hand-made writer, parses back to the same data."""
    data = {"groups": [g.as_dict() for groups in build_groups(RulesConfig()).values() for g in groups]}
    assert yaml.safe_load(dump(data, "a header\nof two lines")) == data


@pytest.mark.parametrize("value", ["plain", "0.99", "yes", "a: b", "line\nwith trailing space \nend",
                                   " leading", "multi\nline\n", "", "quote \" and \\ backslash", "{{ $value }}"])
def test_yaml_writer_keeps_awkward_strings(value: str) -> None:
    data = {"k": value, "l": [value, {"m": value}], "n": 1.5, "e": {}}
    assert yaml.safe_load(dump(data)) == data
