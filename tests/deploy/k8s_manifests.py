"""deploy/kubernetes/ read as the tests need it: every manifest, every pod template, and the
command line each container runs with its $(VAR) references expanded as the kubelet does."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERNETES_DIR = REPO / "deploy" / "kubernetes"
#: The plain Prometheus config (no apiVersion/kind: not a manifest).
SCRAPE_CONFIG = KUBERNETES_DIR / "prometheus" / "prometheus.yml"


@dataclass(frozen=True)
class Manifest:
    path: Path
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.doc["kind"]

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.kind}/{self.doc['metadata']['name']}"


@dataclass(frozen=True)
class Container:
    """One container of a pod template; ``sidecar``: an init container with restartPolicy Always."""
    workload: str
    spec: dict[str, Any]
    sidecar: bool

    @property
    def name(self) -> str:
        return f"{self.workload}/{self.spec['name']}"

    def argv(self) -> list[str]:
        """command + args with $(VAR) expanded from the container's literal env values, as the kubelet
        expands them; a variable set from the downward API (no literal value) stays as $(VAR), as does
        an undefined one (the kubelet leaves those as written too)."""
        env = {e["name"]: e["value"] for e in self.spec.get("env", []) if "value" in e}
        return [_expand(a, env) for a in [*self.spec.get("command", []), *self.spec.get("args", [])]]

    def environment(self, downward: dict[str, str]) -> dict[str, str]:
        """The container's environment as the kubelet builds it: `downward` stands for what each
        valueFrom (fieldRef) variable would be given; a $(VAR) in a value expands from the variables
        defined before it in the list (a later or undefined one stays as written)."""
        env: dict[str, str] = {}
        for e in self.spec.get("env", []):
            env[e["name"]] = _expand(e["value"], env) if "value" in e else downward[e["name"]]
        return env

    def field_refs(self) -> dict[str, str]:
        """Variable -> the downward API field it is set from (fieldRef.fieldPath)."""
        return {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in self.spec.get("env", [])
                if "fieldRef" in e.get("valueFrom", {})}


def _expand(text: str, env: dict[str, str]) -> str:
    # $$ escapes a literal $ (Kubernetes' rule); $(NAME) is replaced only when NAME is defined.
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, text)


def manifest_files() -> list[Path]:
    return sorted(KUBERNETES_DIR.rglob("*.yaml"))


def load_manifests() -> list[Manifest]:
    out = []
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append(Manifest(path, doc))
    return out


def workloads() -> list[Manifest]:
    return [m for m in load_manifests() if m.kind == "Deployment"]


def containers(workload: Manifest) -> list[Container]:
    pod = workload.doc["spec"]["template"]["spec"]
    name = workload.doc["metadata"]["name"]
    return ([Container(name, c, c.get("restartPolicy") == "Always") for c in pod.get("initContainers", [])]
            + [Container(name, c, False) for c in pod["containers"]])


def all_containers() -> list[Container]:
    return [c for w in workloads() for c in containers(w)]


def infersight_argv(container: Container) -> list[str] | None:
    """The arguments after `infersight` (or `python -m infersight`) when the container runs it, else None."""
    argv = container.argv()
    if argv[:1] == ["infersight"]:
        return argv[1:]
    if len(argv) >= 3 and argv[1:3] == ["-m", "infersight"]:
        return argv[3:]
    return None
