"""The part of prometheus-operator's PodMonitor CRD (monitoring.coreos.com/v1) that
deploy/kubernetes/ relies on, as a JSON schema: kubernetes-validate has no schemas for CRDs.

Transcribed from the CRD's openAPIV3Schema (example/prometheus-operator-crd/
monitoring.coreos.com_podmonitors.yaml in prometheus-operator, operator version 0.91): the field
names, types, enums and duration patterns below are the CRD's. The schema is closed
(additionalProperties: false) where the CRD's is open to many more fields: a field outside this
subset fails the test, whether a typo or a new field whose CRD entry must be transcribed first.
"""
from __future__ import annotations

from typing import Any

# The CRD's pattern for interval and scrapeTimeout (monitoringv1.Duration).
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"

RELABEL_ACTIONS = ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap",
                   "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase",
                   "uppercase", "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]

_STRINGS = {"type": "array", "items": {"type": "string"}}

RELABEL_CONFIG: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {"action": {"type": "string", "enum": RELABEL_ACTIONS}, "regex": {"type": "string"},
                   "replacement": {"type": "string"}, "separator": {"type": "string"},
                   "sourceLabels": _STRINGS, "targetLabel": {"type": "string"},
                   "modulus": {"type": "integer"}},
}

LABEL_SELECTOR: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["key", "operator"],
            "properties": {"key": {"type": "string"}, "operator": {"type": "string"}, "values": _STRINGS}}},
    },
}

POD_METRICS_ENDPOINT: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string"},
        "scheme": {"type": "string", "enum": ["http", "https", "HTTP", "HTTPS"]},
        "interval": {"type": "string", "pattern": DURATION},
        "scrapeTimeout": {"type": "string", "pattern": DURATION},
        "honorLabels": {"type": "boolean"},
        "relabelings": {"type": "array", "items": RELABEL_CONFIG},
        "metricRelabelings": {"type": "array", "items": RELABEL_CONFIG},
    },
}

PODMONITOR: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {"type": "object", "required": ["name"], "additionalProperties": False,
                     "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "spec": {
            # selector is the one field the CRD requires in spec.
            "type": "object", "additionalProperties": False, "required": ["selector"],
            "properties": {
                "selector": LABEL_SELECTOR,
                "namespaceSelector": {"type": "object", "additionalProperties": False,
                                      "properties": {"any": {"type": "boolean"}, "matchNames": _STRINGS}},
                "podMetricsEndpoints": {"type": "array", "items": POD_METRICS_ENDPOINT},
                "jobLabel": {"type": "string"},
                "podTargetLabels": _STRINGS,
            },
        },
    },
}
