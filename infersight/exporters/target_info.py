"""The `target_info` series: the agent's resource attributes, once, as Prometheus labels.

OpenTelemetry's Prometheus exporters serve a resource this way (an info-typed family `target`, one
sample `target_info 1` whose labels are the attributes), so the identity of a target is not repeated
on every series. Attribute names become label names as they do there: each character outside
[a-zA-Z0-9_] becomes "_" (k8s.pod.name -> k8s_pod_name), a name starting with a digit gets "key_"
in front, and attributes whose names meet in one label keep their values joined with ";" in the
order of their names. Labels the scrape attaches itself (catalogue.identity.TARGET_LABELS: job,
instance, pod, namespace, ...) are left out, so Prometheus never renames ours to exported_*.
"""
from __future__ import annotations

import re
from typing import Iterator, Mapping

from prometheus_client.core import InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from infersight.exporters import catalogue as C

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def label_name(attribute: str) -> str:
    """An attribute's name as a Prometheus label name (OpenTelemetry's rule, above)."""
    name = _INVALID.sub("_", attribute)
    return f"key_{name}" if name[:1].isdigit() else name


def label_value(value: object) -> str:
    """Strings as they are; booleans lower case; sequences as JSON-like lists (OTel's array rule)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_quoted(v) for v in value) + "]"
    return str(value)


def _quoted(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else label_value(value)


def target_labels(attributes: Mapping[str, object]) -> dict[str, str]:
    """The labels of target_info for these resource attributes (empty names and values are dropped:
    Prometheus treats an empty label as an absent one)."""
    merged: dict[str, list[tuple[str, str]]] = {}
    for key in sorted(attributes):
        name, value = label_name(key), label_value(attributes[key])
        if not key or not value or name in C.TARGET_LABELS or name.startswith("__"):
            continue
        merged.setdefault(name, []).append((key, value))
    return {name: ";".join(v for _, v in pairs) for name, pairs in merged.items()}


def target_info_family(attributes: Mapping[str, object]) -> InfoMetricFamily:
    """The family (OpenMetrics type info, name `target`, sample `target_info`) for one resource."""
    labels = target_labels(attributes)
    family = InfoMetricFamily(C.TARGET_INFO.name.removesuffix("_info"), C.TARGET_INFO.help)
    family.add_metric([], labels)
    return family


class TargetInfoCollector(Collector):
    """Serves target_info for the resource it was built with (the agent's, fixed for its life)."""

    def __init__(self, attributes: Mapping[str, object]) -> None:
        self._family = target_info_family(attributes)

    def collect(self) -> Iterator[Metric]:
        yield self._family
