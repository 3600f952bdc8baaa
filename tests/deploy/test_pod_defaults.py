"""The pods' safe defaults, as a reviewer would check them: non-root, read-only root file system,
no capabilities, no privilege escalation, the runtime's seccomp profile; probes on /health; the
agent's requests and limits; and /dev/shm (memory-backed) as the one volume both containers mount."""
from __future__ import annotations

import pytest
from k8s_manifests import Container, Manifest, containers, workloads

WORKLOADS = workloads()


def _pod(workload: Manifest) -> dict:
    return workload.doc["spec"]["template"]["spec"]


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_pod_runs_unprivileged(workload: Manifest) -> None:
    pod = _pod(workload)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert pod.get("hostPID") is not True and pod.get("hostIPC") is not True and pod.get("hostNetwork") is not True
    assert pod.get("shareProcessNamespace") is not True  # the two containers see separate pid namespaces
    for c in containers(workload):
        ctx = c.spec["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False, c.name
        assert ctx["readOnlyRootFilesystem"] is True, c.name
        assert ctx["capabilities"] == {"drop": ["ALL"]}, c.name
        assert ctx.get("privileged") is not True and "runAsUser" not in ctx, c.name  # the pod's uid for both


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_only_dev_shm_is_shared_and_it_is_memory(workload: Manifest) -> None:
    pod = _pod(workload)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = [{m["name"]: m["mountPath"] for m in c.spec["volumeMounts"]} for c in containers(workload)]
    assert len(mounts) == 2
    shared = mounts[0].keys() & mounts[1].keys()
    assert len(shared) == 1, f"{workload.name} shares {sorted(shared)}"
    (name,) = shared
    assert mounts[0][name] == mounts[1][name] == "/dev/shm"
    assert volumes[name]["emptyDir"]["medium"] == "Memory"
    assert "sizeLimit" in volumes[name]["emptyDir"]
    # Every volume is an emptyDir: nothing of the node's file system is mounted.
    assert all(set(v) == {"name", "emptyDir"} for v in volumes.values()), workload.name


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_writable_paths_are_volumes(workload: Manifest) -> None:
    """With a read-only root, what each process writes must be a mount: the agent's token lives in
    $XDG_STATE_HOME/infersight (infersight/agent/api/token_file.py), Python and torch use /tmp and $HOME."""
    for c in containers(workload):
        mounted = {m["mountPath"] for m in c.spec["volumeMounts"]}
        env = {e["name"]: e["value"] for e in c.spec["env"] if "value" in e}
        assert "/tmp" in mounted, c.name
        for var in ("HOME", "XDG_STATE_HOME"):
            if var in env:
                assert any(env[var] == p or env[var].startswith(p + "/") for p in mounted), (c.name, var)
        if c.sidecar:
            assert "XDG_STATE_HOME" in env, "the agent's token directory must be on a volume"


def _probe_targets(c: Container) -> dict[str, tuple[str, str]]:
    return {kind: (c.spec[kind]["httpGet"]["path"], c.spec[kind]["httpGet"]["port"])
            for kind in ("startupProbe", "readinessProbe", "livenessProbe") if kind in c.spec}


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_probes_hit_health_on_declared_ports(workload: Manifest) -> None:
    for c in containers(workload):
        probes = _probe_targets(c)
        ports = {p["name"] for p in c.spec["ports"]}
        assert "livenessProbe" in probes and "startupProbe" in probes, c.name
        assert all(path == "/health" and port in ports for path, port in probes.values()), (c.name, probes)
        # The sidecar has no readinessProbe: its readiness would count toward the pod's and a stalled
        # agent would take the engine out of its Service. The engine has one.
        assert ("readinessProbe" in probes) is not c.sidecar, c.name


def _bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    return int(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity)


def _cores(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_agent_has_requests_and_limits(workload: Manifest) -> None:
    (agent,) = [c for c in containers(workload) if c.sidecar]
    res = agent.spec["resources"]
    assert _bytes(res["requests"]["memory"]) <= _bytes(res["limits"]["memory"])
    assert _cores(res["requests"]["cpu"]) <= _cores(res["limits"]["cpu"])
    # Both pods give their agent the same resources: one agent, one set of measurements.
    assert res == next(c for c in containers(WORKLOADS[0]) if c.sidecar).spec["resources"]
