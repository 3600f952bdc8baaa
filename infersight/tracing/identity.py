"""Who the agent is: its OpenTelemetry resource, on every span and OTLP metric it exports and, as
target_info, on its Prometheus exposition (exporters.target_info).

The attributes come from the standard places, read by the OpenTelemetry SDK (nothing here parses
them): OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME (the SDK's OTELResourceDetector), with the
SDK's own service.instance.id (a random UUID v4 per process) and telemetry.sdk.* beneath them. In a
pod the Kubernetes downward API fills OTEL_RESOURCE_ATTRIBUTES (deploy/kubernetes/*/deployment.yaml:
k8s.pod.name, k8s.namespace.name, k8s.node.name, k8s.pod.uid, k8s.container.name, and
service.instance.id as <namespace>.<pod>.<container>, the semantic conventions' form), composed by
Kubernetes' own $(VAR) expansion. Precedence, lowest first:

    IdentityConfig.service_name, host.name = the hostname     (defaults, only where nothing else says)
    the SDK's detectors: service.instance.id, telemetry.sdk.*
    OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME           (the environment)
    IdentityConfig.attributes                                  (given in code)

The config is light; OpenTelemetry is imported only when the resource is built.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

DEFAULT_SERVICE_NAME = "infersight"


@dataclass(frozen=True)
class IdentityConfig:
    """service_name: service.name when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one.
    attributes: (key, value) pairs set in code; they win over the environment."""

    service_name: str = DEFAULT_SERVICE_NAME
    attributes: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.service_name:
            raise ValueError("the default service name must not be empty")
        object.__setattr__(self, "attributes", tuple((str(k), str(v)) for k, v in self.attributes))
        if any(not k for k, _ in self.attributes):
            raise ValueError("resource attribute names must not be empty")


def identity_resource(config: IdentityConfig | None = None) -> "Resource":
    """The resource, built once by its owner (the agent) and handed to tracing and the exposition."""
    from opentelemetry.sdk.resources import HOST_NAME, SERVICE_NAME, OTELResourceDetector, Resource

    config = config or IdentityConfig()
    from_env = OTELResourceDetector().detect().attributes  # the SDK's parse of the two variables
    defaults = {SERVICE_NAME: config.service_name, HOST_NAME: socket.gethostname()}
    # Resource.create merges its argument over the environment: pass only the defaults nothing set.
    return Resource.create({**{k: v for k, v in defaults.items() if k not in from_env}, **dict(config.attributes)})


def resource_attributes(resource: "Resource") -> Mapping[str, object]:
    """The attributes as a plain mapping (what the Prometheus exposition is handed)."""
    return dict(resource.attributes)
