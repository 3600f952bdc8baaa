"""Who produced a series: the identity labels and the target_info family (IDENTITY_METRICS).

On Prometheus, identity follows the OpenTelemetry / OpenMetrics way: the agent's resource attributes
(service, pod, namespace, node, host: infersight.tracing.identity) appear once, as the labels of one
`target_info` series of value 1, not repeated on every series; a query that wants them joins on it
(`* on (job, instance) group_left (k8s_node_name) target_info`). The engine's families carry one
identity label of their own, model_name (the served model, as vLLM labels its series); its values
are bounded by the models the agent serves (one per engine). No family carries a label that the
scrape itself attaches (TARGET_LABELS): Prometheus would rename ours to exported_<name>.
"""
from __future__ import annotations

from infersight.exporters.catalogue.spec import MetricSpec

#: The served model's name on every engine family (catalogue.engine), as vLLM's own series have it.
MODEL_LABEL = "model_name"

#: The engine a series of an engine family came from, when one agent reads several engines' rings
#: (agent.rings.engine_scope: after the family's own labels, before model_name; off with a single ring). Its
#: values are the names the engines announce (bounded by the rings the agent reads).
ENGINE_LABEL = "engine"
#: Engine families that are the agent's as a whole, never an engine's: the GPU energy no step used
#: (one account over the GPUs the agent reads, shared by the engines on them).
AGENT_WIDE_ENGINE_FAMILIES = frozenset({"infersight_energy_idle_joules"})


def engine_labelled(spec: MetricSpec) -> bool:
    """Whether a family carries the engine label when it is on: the engine families (model_name)
    but the agent-wide ones."""
    return MODEL_LABEL in spec.identity_labels and spec.name not in AGENT_WIDE_ENGINE_FAMILIES


#: Labels Prometheus' scrape attaches to every series of a target: job and instance always; namespace,
#: pod, container, service, endpoint and node from Kubernetes discovery (PodMonitor, the plain scrape
#: config's relabelling). A resource attribute that would be served under one of these names is left
#: off target_info; the series' own target labels already say it.
TARGET_LABELS = ("job", "instance", "namespace", "pod", "container", "service", "endpoint", "node")

#: Info-typed (OpenMetrics `# TYPE target info`; the classic text format serves it as a gauge).
#: Its labels are the resource's attributes, so the spec lists none: they differ from agent to agent.
TARGET_INFO = MetricSpec("target_info", "info",
                         "Target metadata: the agent's OpenTelemetry resource attributes (OTEL_RESOURCE_ATTRIBUTES, "
                         "OTEL_SERVICE_NAME, the Kubernetes downward API) as labels, dots as underscores; value 1.")

#: Served by the agent beside CATALOGUE, by its own collector (exporters.target_info).
IDENTITY_METRICS: tuple[MetricSpec, ...] = (TARGET_INFO,)
