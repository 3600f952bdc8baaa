"""Which of a node's GPU series are this agent's engine's: the selection a dcgm-exporter scrape is
filtered by (exporter_text.parse_exposition).

In a Kubernetes pod the agent is a sidecar without GPUs; the node's dcgm-exporter reports every GPU
of the node, most of them other pods'. Two facts say which are ours:

- the engine's GPU UUIDs, from the GPU records it writes to its ring (probes.gpu_uuids); they come
  after the agent starts, so `set_uuids` updates them (the agent's GPU part, at each poll);
- dcgm-exporter's Kubernetes mapping, when it is on, labels the series of a GPU allocated to a pod
  with `pod`, `namespace` (and `container`): those of our pod (the agent's identity:
  k8s.pod.name, k8s.namespace.name) are ours.

A series is kept when its UUID is one of the engine's, or its pod label names our pod (and its
namespace label, when it has one, our namespace). With neither known (no UUID reported, no pod
name: one engine on a host outside Kubernetes, as before) every series is kept. In a pod before
the engine has reported, a series without our pod label is not kept: the node's other GPUs are
never counted as the engine's, not even for a poll.
"""
from __future__ import annotations

from typing import Iterable, Mapping

POD_LABEL = "pod"
NAMESPACE_LABEL = "namespace"


class GpuSelection:
    """pod, namespace: ours ("" outside a pod). The UUID set is replaced whole (one assignment of a
    frozenset): the sampler's thread reads it while the agent's poll thread sets it."""

    def __init__(self, pod: str = "", namespace: str = "", uuids: Iterable[str] = ()) -> None:
        self.pod, self.namespace = pod, namespace
        self.uuids: frozenset[str] = frozenset(uuids)

    def set_uuids(self, uuids: Iterable[str]) -> None:
        self.uuids = frozenset(uuids)

    @property
    def open(self) -> bool:
        """Nothing to select by yet: every series is kept."""
        return not self.uuids and not self.pod

    def keeps(self, uuid: str, labels: Mapping[str, str]) -> bool:
        """Whether a series of GPU `uuid` with these exporter labels is this engine's."""
        uuids = self.uuids
        if not uuids and not self.pod:
            return True
        if uuid and uuid in uuids:
            return True
        if self.pod and labels.get(POD_LABEL) == self.pod:
            namespace = labels.get(NAMESPACE_LABEL)
            return not namespace or not self.namespace or namespace == self.namespace
        return False

    def describe(self) -> str:
        """For the status line: what the selection goes by."""
        if self.open:
            return "every GPU (no engine GPU reported, not in a pod)"
        parts = [f"{len(self.uuids)} engine GPU UUID(s)"] if self.uuids else ["no engine GPU UUID yet"]
        if self.pod:
            parts.append(f"pod {self.namespace + '/' if self.namespace else ''}{self.pod}")
        return ", ".join(parts)
