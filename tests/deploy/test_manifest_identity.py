"""Every container that exports telemetry is given its identity by the downward API: the variables come
from the right pod fields, and OTEL_RESOURCE_ATTRIBUTES, expanded as the kubelet expands it, is read
by the agent's own resource builder (the OpenTelemetry SDK's parser) into the pod's attributes."""
from __future__ import annotations

import pytest
from k8s_manifests import Container, all_containers

from infersight.tracing.identity import identity_resource

#: The downward API fields each variable must come from (the Kubernetes API's field paths).
FIELDS = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid",
          "NODE_NAME": "spec.nodeName"}
#: Stand-ins for those fields' values in a running pod.
DOWNWARD = {"NODE_IP": "10.0.3.7", "POD_NAME": "vllm-7d9f5c-x2k4q", "POD_NAMESPACE": "inference",
            "NODE_NAME": "gpu-node-3", "POD_UID": "0b6f3c1e-1d2a-4c55-9d0e-3f1b2a7c9e10"}
IDENTIFIED = [c for c in all_containers() if any(e["name"] == "OTEL_RESOURCE_ATTRIBUTES" for e in c.spec.get("env", []))]


def test_every_agent_sidecar_is_identified() -> None:
    assert {c.name for c in all_containers() if c.sidecar} <= {c.name for c in IDENTIFIED}


@pytest.mark.parametrize("container", IDENTIFIED, ids=lambda c: c.name)
def test_identity_variables_come_from_the_pod(container: Container) -> None:
    refs = container.field_refs()
    assert {name: refs[name] for name in FIELDS} == FIELDS


@pytest.mark.parametrize("container", IDENTIFIED, ids=lambda c: c.name)
def test_resource_attributes_expand_to_the_pod(container: Container, monkeypatch: pytest.MonkeyPatch) -> None:
    env = container.environment(DOWNWARD)
    assert "$(" not in env["OTEL_RESOURCE_ATTRIBUTES"]  # every reference defined before it
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", env["OTEL_RESOURCE_ATTRIBUTES"])
    attrs = identity_resource().attributes
    name = container.spec["name"]
    want = {"k8s.pod.name": "vllm-7d9f5c-x2k4q", "k8s.namespace.name": "inference", "k8s.node.name": "gpu-node-3",
            "k8s.pod.uid": "0b6f3c1e-1d2a-4c55-9d0e-3f1b2a7c9e10", "k8s.container.name": name,
            "host.name": "gpu-node-3", "service.instance.id": f"inference.vllm-7d9f5c-x2k4q.{name}"}
    assert {k: attrs[k] for k in want} == want
