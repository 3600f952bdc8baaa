"""Every manifest in deploy/kubernetes/ against the Kubernetes API schemas (kubernetes-validate,
strict: an unknown field is an error), and the PodMonitors against the CRD fields they use."""
from __future__ import annotations

import copy

import jsonschema
import kubernetes_validate
import pytest
from k8s_manifests import Manifest, load_manifests, manifest_files, workloads
from podmonitor_schema import PODMONITOR

#: The oldest Kubernetes whose API server enables native sidecars by default (beta in 1.29, GA in
#: 1.33), and the newest this kubernetes-validate knows.
OLDEST = "1.29"
VERSIONS = (OLDEST, kubernetes_validate.latest_version())
#: Kinds with no schema in kubernetes-validate (CRDs), checked against podmonitor_schema instead.
CRD_KINDS = {"PodMonitor"}

MANIFESTS = load_manifests()


def test_there_are_manifests_of_each_kind_the_issue_asks_for() -> None:
    kinds = sorted(m.kind for m in MANIFESTS)
    assert kinds.count("Deployment") == 2, kinds  # vLLM and infersight serve
    assert {"Service", "PodMonitor", "NetworkPolicy"} <= set(kinds), kinds
    # Every .yaml under deploy/kubernetes/ holds manifests only (the Prometheus config is .yml).
    assert {m.path for m in MANIFESTS} == set(manifest_files())


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("manifest", [m for m in MANIFESTS if m.kind not in CRD_KINDS], ids=lambda m: m.name)
def test_manifest_is_valid_against_the_kubernetes_schema(manifest: Manifest, version: str) -> None:
    try:
        kubernetes_validate.validate(manifest.doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{manifest.name} is invalid for Kubernetes {version} at "
                    f"{'.'.join(map(str, exc.path))}: {exc.message}")


def test_crd_kinds_are_the_only_ones_without_a_schema() -> None:
    for m in MANIFESTS:
        if m.kind in CRD_KINDS:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(m.doc, OLDEST, strict=True)


def test_strict_validation_catches_a_misspelt_field_and_a_too_old_cluster() -> None:
    """The check has teeth: a misspelt securityContext field fails; so does the native sidecar's
    restartPolicy on a container against Kubernetes 1.27, whose API has no such field."""
    deployment = workloads()[0].doc
    typo = copy.deepcopy(deployment)
    sidecar = typo["spec"]["template"]["spec"]["initContainers"][0]
    sidecar["securityContext"]["readOnlyRootFileSystem"] = sidecar["securityContext"].pop("readOnlyRootFilesystem")
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFileSystem"):
        kubernetes_validate.validate(typo, OLDEST, strict=True)
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicy"):
        kubernetes_validate.validate(deployment, "1.27", strict=True)


PODMONITORS = [m for m in MANIFESTS if m.kind == "PodMonitor"]


@pytest.mark.parametrize("monitor", PODMONITORS, ids=lambda m: m.name)
def test_podmonitor_uses_only_crd_fields(monitor: Manifest) -> None:
    jsonschema.Draft202012Validator(PODMONITOR).validate(monitor.doc)


def test_podmonitor_schema_rejects_a_field_outside_the_crd() -> None:
    doc = copy.deepcopy(PODMONITORS[0].doc)
    doc["spec"]["podMetricsEndpoints"][0]["targetPortName"] = "infersight"  # not a PodMetricsEndpoint field
    with pytest.raises(jsonschema.ValidationError, match="targetPortName"):
        jsonschema.Draft202012Validator(PODMONITOR).validate(doc)


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    unit = "ms" if duration.endswith("ms") else duration[-1]
    return float(duration[: -len(unit)]) * units[unit]


@pytest.mark.parametrize("monitor", PODMONITORS, ids=lambda m: m.name)
def test_podmonitor_selects_a_deployment_and_names_its_ports(monitor: Manifest) -> None:
    """What the operator would find: the selector matches one Deployment's pod labels in the same
    folder, every endpoint's port is a declared container port of that pod, and no scrapeTimeout
    exceeds its interval (the operator rejects that resource)."""
    selector = monitor.doc["spec"]["selector"]["matchLabels"]
    matched = [w for w in workloads() if w.path.parent == monitor.path.parent
               and selector.items() <= w.doc["spec"]["template"]["metadata"]["labels"].items()]
    assert len(matched) == 1, f"{monitor.name} selects {[w.name for w in matched]}"
    pod = matched[0].doc["spec"]["template"]["spec"]
    ports = {p["name"] for c in [*pod.get("initContainers", []), *pod["containers"]] for p in c.get("ports", [])}
    for endpoint in monitor.doc["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in ports, f"{monitor.name}: no container port named {endpoint['port']!r}"
        assert _seconds(endpoint["scrapeTimeout"]) <= _seconds(endpoint["interval"])
    assert "infersight" in {e["port"] for e in monitor.doc["spec"]["podMetricsEndpoints"]}
