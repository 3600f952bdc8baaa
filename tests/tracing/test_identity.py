"""Identity: the agent's OpenTelemetry resource from OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME (as a
pod's downward API fills them), on the wire of every OTLP span and metric export, and on /metrics as
one target_info series, with model_name on the engine's series and no scrape-owned label anywhere."""
from __future__ import annotations

import socket
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from infersight.agent.config import AgentConfig
from infersight.agent.gpu_config import GpuConfig
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.agent.service import Agent
from infersight.bench.serving.otlp_sink import OtlpSink
from infersight.exporters import catalogue as C
from infersight.tracing.config import TracingConfig
from infersight.tracing.identity import IdentityConfig, identity_resource

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_workload import make_engine, run_workload, unique_ring  # noqa: E402

#: What a pod's downward API gives the agent (deploy/kubernetes: Kubernetes expands the $(VAR)s into
#: this one variable), one value percent-encoded as the variable's format requires (%2C is a comma).
POD_ENV = ("k8s.pod.name=vllm-7d9f5c-x2k4q,k8s.namespace.name=inference,k8s.node.name=gpu-node-3,"
           "k8s.pod.uid=0b6f3c1e-1d2a-4c55-9d0e-3f1b2a7c9e10,k8s.container.name=infersight-agent,"
           "service.instance.id=inference.vllm-7d9f5c-x2k4q.infersight-agent,deployment.note=a%2Cb")
#: The same, written out by hand: what every span, OTLP metric and target_info must carry.
POD = {"k8s.pod.name": "vllm-7d9f5c-x2k4q", "k8s.namespace.name": "inference", "k8s.node.name": "gpu-node-3",
       "k8s.pod.uid": "0b6f3c1e-1d2a-4c55-9d0e-3f1b2a7c9e10", "k8s.container.name": "infersight-agent",
       "service.instance.id": "inference.vllm-7d9f5c-x2k4q.infersight-agent", "deployment.note": "a,b",
       "service.name": "vllm-sidecar"}
#: POD's labels on target_info, dots as underscores (written out, not derived from POD).
POD_LABELS = {"k8s_pod_name": "vllm-7d9f5c-x2k4q", "k8s_namespace_name": "inference", "k8s_node_name": "gpu-node-3",
              "k8s_pod_uid": "0b6f3c1e-1d2a-4c55-9d0e-3f1b2a7c9e10", "k8s_container_name": "infersight-agent",
              "service_instance_id": "inference.vllm-7d9f5c-x2k4q.infersight-agent", "deployment_note": "a,b",
              "service_name": "vllm-sidecar"}
MODEL = "my-model"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME", "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# -- the resource ---------------------------------------------------------------------------------------
def test_defaults_without_environment(clean_env: pytest.MonkeyPatch) -> None:
    attrs = dict(identity_resource().attributes)
    assert attrs["service.name"] == "infersight"
    assert attrs["host.name"] == socket.gethostname()
    assert uuid.UUID(str(attrs["service.instance.id"])).version == 4  # the SDK's own, random per process
    assert attrs["telemetry.sdk.language"] == "python"
    assert not any(k.startswith("k8s.") for k in attrs)


def test_the_pods_environment_names_it(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("OTEL_RESOURCE_ATTRIBUTES", POD_ENV + ",host.name=vllm-7d9f5c-x2k4q")
    clean_env.setenv("OTEL_SERVICE_NAME", "vllm-sidecar")
    attrs = dict(identity_resource().attributes)
    assert {k: attrs[k] for k in POD} == POD
    assert attrs["host.name"] == "vllm-7d9f5c-x2k4q"  # the environment's, not the default


def test_service_name_in_resource_attributes_is_kept(clean_env: pytest.MonkeyPatch) -> None:
    """service.name given only inside OTEL_RESOURCE_ATTRIBUTES is not replaced by our default."""
    clean_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes")
    assert identity_resource(IdentityConfig(service_name="mine")).attributes["service.name"] == "from-attributes"
    clean_env.setenv("OTEL_SERVICE_NAME", "from-service-name")  # the SDK's rule: this one wins
    assert identity_resource().attributes["service.name"] == "from-service-name"


def test_attributes_given_in_code_win(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.node.name=from-env,k8s.pod.name=p")
    attrs = identity_resource(IdentityConfig(attributes=(("k8s.node.name", "from-code"),))).attributes
    assert (attrs["k8s.node.name"], attrs["k8s.pod.name"]) == ("from-code", "p")


def test_config_refuses_empty_names() -> None:
    with pytest.raises(ValueError):
        IdentityConfig(service_name="")
    with pytest.raises(ValueError):
        IdentityConfig(attributes=(("", "x"),))


# -- the agent, end to end ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pod_agent():
    """An agent with the pod's environment, OTLP spans and metrics on, after a workload; returns the
    workload, its /metrics text and the OTLP bodies it sent (after close: the last export included)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_RESOURCE_ATTRIBUTES", POD_ENV)
        env.setenv("OTEL_SERVICE_NAME", "vllm-sidecar")
        env.delenv("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", raising=False)
        sink = OtlpSink(keep_bodies=True)
        ring = unique_ring("identity")
        engine, probe = make_engine(ring)
        agent = Agent(AgentConfig(rings=[ring], port=0,
                                  tracing=TracingConfig(otlp_endpoint=sink.url, otlp_metrics=True),
                                  exposition=ExpositionConfig(model_name=MODEL), gpu=GpuConfig(source="none")))
        agent.start_http()
        try:
            work = run_workload(engine, agent.poll_once)
            for _ in range(3):
                agent.poll_once()
            text = httpx.get(f"http://127.0.0.1:{agent.port}/metrics", timeout=10).text
        finally:
            agent.close()
            probe.close()
            sink.close()
        yield work, text, sink.bodies


def _attributes(resource) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in resource.attributes}


def test_every_exported_span_and_metric_carries_the_pod(pod_agent) -> None:
    work, _, bodies = pod_agent
    spans = metrics = 0
    for path, body in bodies:
        if path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            for rs in request.resource_spans:
                assert {k: v for k, v in _attributes(rs.resource).items() if k in POD} == POD
                spans += sum(len(ss.spans) for ss in rs.scope_spans)
        else:
            assert path == "/v1/metrics"
            request = ExportMetricsServiceRequest.FromString(body)
            for rm in request.resource_metrics:
                assert {k: v for k, v in _attributes(rm.resource).items() if k in POD} == POD
                metrics += sum(len(sm.metrics) for sm in rm.scope_metrics)
    assert spans >= len(work.prompts)  # a request span each, at least (ratio 1)
    assert metrics >= 1


def test_target_info_holds_the_pod_and_nothing_the_scrape_owns(pod_agent) -> None:
    _, text, _ = pod_agent
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    (info,) = fams["target_info"].samples
    assert info.value == 1.0
    assert {k: v for k, v in info.labels.items() if k in POD_LABELS} == POD_LABELS
    assert info.labels["host_name"] == socket.gethostname()
    owned = set(C.TARGET_LABELS)
    for fam in fams.values():
        for s in fam.samples:
            assert not owned & set(s.labels), (s.name, s.labels)
            # the pod's identity is on target_info only, never repeated on a series
            assert fam.name == "target_info" or not any(k.startswith("k8s_") for k in s.labels), s.name


def test_engine_series_carry_the_served_model(pod_agent) -> None:
    work, text, _ = pod_agent
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    requests = [s for s in fams[C.REQUESTS.name].samples if s.name == C.REQUESTS.sample]
    assert {s.labels["model_name"] for s in requests} == {MODEL}
    assert sum(s.value for s in requests) == len(work.prompts)
    for spec in C.ENGINE_METRICS:
        for s in fams[spec.name].samples if spec.name in fams else []:
            assert s.labels.get("model_name") == MODEL, (spec.name, s.labels)
    for spec in C.GPU_METRICS:  # not an engine's: no model_name
        assert spec.identity_labels == ()
