"""The Dockerfiles beside the manifests, read against what they name (the images are not built
here: no Docker): the extras they install exist in pyproject.toml, the modules their build step
imports exist, vLLM's plugin entry points are the ones the package declares, and the image's user
is the pods' runAsUser."""
from __future__ import annotations

import importlib.util
import re
import tomllib

import pytest
from k8s_manifests import KUBERNETES_DIR, REPO, workloads

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DOCKERFILES = sorted(KUBERNETES_DIR.rglob("Dockerfile"))


def test_there_is_a_dockerfile_per_deployment() -> None:
    assert {p.parent for p in DOCKERFILES} == {w.path.parent for w in workloads()}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_installed_extras_exist(dockerfile) -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    named = [e for group in re.findall(r"infersight-\*\.whl\)?\[([a-z,]+)\]", dockerfile.read_text())
             for e in group.split(",")]
    assert all(e in extras for e in named), (named, sorted(extras))
    if dockerfile.parent.name == "vllm":
        # The plugins and the middleware need [vllm]; vLLM sends its spans over OTLP/gRPC, which the
        # agent receives with [grpc].
        assert {"vllm", "grpc"} <= set(named)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_build_time_imports_name_real_modules(dockerfile) -> None:
    for line in re.findall(r'python3? -c "import ([^"]+)"', dockerfile.read_text()):
        for module in (m.strip() for m in line.split(",")):
            if module.startswith("infersight"):
                assert importlib.util.find_spec(module) is not None, module


def test_vllm_image_checks_every_plugin_vllm_loads() -> None:
    """Each entry point vLLM loads (pyproject's vllm.* groups) is imported at build time."""
    text = (KUBERNETES_DIR / "vllm" / "Dockerfile").read_text()
    groups = {k: v for k, v in PYPROJECT["project"]["entry-points"].items() if k.startswith("vllm.")}
    targets = {ref.split(":")[0] for group in groups.values() for ref in group.values()}
    assert targets and all(t in text for t in targets), targets


@pytest.mark.parametrize("workload", workloads(), ids=lambda w: w.name)
def test_image_user_is_the_pods_user(workload) -> None:
    dockerfile = (workload.path.parent / "Dockerfile").read_text()
    uid, gid = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M).groups()  # type: ignore[union-attr]
    ctx = workload.doc["spec"]["template"]["spec"]["securityContext"]
    assert (ctx["runAsUser"], ctx["runAsGroup"]) == (int(uid), int(gid))
