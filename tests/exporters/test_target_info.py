"""target_info: resource attributes as the labels of one info series, named as OpenTelemetry's
Prometheus exporters name them; never a label the scrape attaches itself."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from infersight.exporters.target_info import TargetInfoCollector, label_name, target_labels


def test_label_names() -> None:
    assert label_name("k8s.pod.name") == "k8s_pod_name"
    assert label_name("service.instance.id") == "service_instance_id"
    assert label_name("cloud-region/zone") == "cloud_region_zone"
    assert label_name("9lives") == "key_9lives"


def test_names_that_meet_keep_both_values_in_name_order() -> None:
    assert target_labels({"a_b": "2", "a.b": "1"}) == {"a_b": "1;2"}  # "a.b" sorts before "a_b"


def test_scrape_owned_names_and_empty_values_are_left_out() -> None:
    given = {"job": "j", "instance": "i", "namespace": "n", "pod": "p", "container": "c", "node": "x",
             "__meta": "m", "k8s.pod.name": "p-1", "empty": "", "flag": True, "ports": [1, 2]}
    assert target_labels(given) == {"k8s_pod_name": "p-1", "flag": "true", "ports": "[1,2]"}


def test_info_type_in_openmetrics_and_a_gauge_in_text() -> None:
    registry = CollectorRegistry()
    registry.register(TargetInfoCollector({"k8s.node.name": "gpu-node-3", "service.name": "infersight"}))
    (family,) = parse_openmetrics(generate_openmetrics(registry).decode())
    assert (family.name, family.type) == ("target", "info")
    (sample,) = family.samples
    assert (sample.name, sample.labels, sample.value) == (
        "target_info", {"k8s_node_name": "gpu-node-3", "service_name": "infersight"}, 1.0)
    text = generate_latest(registry).decode()
    assert '# TYPE target_info gauge\ntarget_info{k8s_node_name="gpu-node-3",service_name="infersight"} 1.0\n' in text
