"""The targets Prometheus' Kubernetes pod discovery (kubernetes_sd_configs, role: pod) makes of a
pod, modelled from its documented label set, for a Prometheus built without Kubernetes discovery
(Debian's: its changelog says Kubernetes support was removed) to relabel as file_sd targets.

Per the Prometheus configuration docs (pod role): one target per declared port of every container,
init containers included with __meta_kubernetes_pod_container_init="true"; a container without
ports gets one port-less target; __address__ is the pod IP and the port; pod labels appear as
__meta_kubernetes_pod_label_<name> with every character outside [a-zA-Z0-9_] replaced by "_".
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pod:
    """A pod made from a Deployment's template as the API server would run it."""
    name: str
    namespace: str
    ip: str
    phase: str
    node: str
    labels: dict[str, str]
    spec: dict[str, Any]


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_targets(pod: Pod, address_of: dict[tuple[str, str], str] | None = None) -> list[dict[str, str]]:
    """The discovered label sets of ``pod``. ``address_of``: (container, port name) -> HOST:PORT to put
    in __address__ instead of the pod IP and declared port (a test's loopback listener)."""
    common = {"__meta_kubernetes_namespace": pod.namespace, "__meta_kubernetes_pod_name": pod.name,
              "__meta_kubernetes_pod_ip": pod.ip, "__meta_kubernetes_pod_phase": pod.phase,
              "__meta_kubernetes_pod_ready": "true" if pod.phase == "Running" else "false",
              "__meta_kubernetes_pod_node_name": pod.node}
    for key, value in pod.labels.items():
        common[f"__meta_kubernetes_pod_label_{_sanitize(key)}"] = value
        common[f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"] = "true"
    out = []
    listed = [(c, "false") for c in pod.spec["containers"]] + [(c, "true") for c in pod.spec.get("initContainers", [])]
    for container, init in listed:
        base = {**common, "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_image": container["image"],
                "__meta_kubernetes_pod_container_init": init}
        if not container.get("ports"):
            out.append({**base, "__address__": pod.ip})
        for port in container.get("ports", []):
            address = (address_of or {}).get((container["name"], port["name"]), f"{pod.ip}:{port['containerPort']}")
            out.append({**base, "__address__": address,
                        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                        "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP")})
    return out
