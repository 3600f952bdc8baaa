"""Each pod's agent sidecar, run from its manifest's own command line and environment under the
pod's security context: uid 2000 without capabilities or new privileges, every file system
read-only but the container's volumes (fresh tmpfs, group-owned as an emptyDir with fsGroup),
alone in a network namespace (the pod's: it listens on 0.0.0.0 there). It must start, answer
/health and /metrics, keep its capture token private in its own volume and demand it, and write
nowhere else. tests/deploy/pod_sandbox.py does the namespace work (root and util-linux needed,
as CI has)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from k8s_manifests import REPO, Container, all_containers, infersight_argv, workloads
from testkit import require_service

from infersight.commands.agent import parse_listen

SANDBOX = Path(__file__).with_name("pod_sandbox.py")
AGENTS = [c for c in all_containers() if c.sidecar]
#: What the downward API would give the pod (status.hostIP and the rest).
DOWNWARD = {"NODE_IP": "127.0.0.1", "POD_NAME": "pod-0", "POD_NAMESPACE": "inference", "NODE_NAME": "node-0",
            "POD_UID": "5d8a2f7e-0c1b-4e9a-8f3d-2b6c7a1e9d04"}
#: Log lines that mean the container's volumes or permissions are not enough.
WRITE_FAILURES = ("Read-only file system", "Permission denied", "PermissionError", "Traceback")


def _sandbox_available() -> str | None:
    if os.geteuid() != 0:
        return "not root (the sandbox mounts tmpfs and remounts read-only in its own namespace)"
    missing = [t for t in ("unshare", "setpriv", "findmnt", "ip", "mount") if shutil.which(t) is None]
    return f"missing {', '.join(missing)}" if missing else None


def _environment(container: Container) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", **container.environment(DOWNWARD)}


@pytest.mark.parametrize("container", AGENTS, ids=lambda c: c.name)
def test_agent_runs_under_the_pods_security_context(container: Container) -> None:
    why = _sandbox_available()
    if why:
        require_service("a root sandbox (unshare, setpriv)", why)
    env = _environment(container)
    argv = [a.replace("$(NODE_IP)", DOWNWARD["NODE_IP"]) for a in infersight_argv(container) or []]
    _, port = parse_listen(next(a.split("=", 1)[1] for a in argv if a.startswith("--listen=")))
    pod = next(w for w in workloads()
               if w.doc["metadata"]["name"] == container.workload).doc["spec"]["template"]["spec"]
    spec = {"argv": [sys.executable, "-m", "infersight", *argv], "env": env,
            "volumes": [m["mountPath"] for m in container.spec["volumeMounts"]],
            "uid": pod["securityContext"]["runAsUser"], "gid": pod["securityContext"]["fsGroup"],
            "health": f"http://127.0.0.1:{port}/health",
            "token_file": f"{env['XDG_STATE_HOME']}/infersight/agent-{port}.token", "settle_s": 3,
            "read_only_checks": ["/", str(REPO), os.path.dirname(os.path.realpath(sys.executable))]}
    done = subprocess.run(["unshare", "--mount", "--net", "--fork", sys.executable, str(SANDBOX), json.dumps(spec)],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    log = report["log"]
    assert all(report["read_only"].values()), report["read_only"]  # the sandbox really is read-only
    assert report["health"] == 200 and report["metrics"] == 200, log
    # The one control endpoint: refused without the token, accepted past auth with it (the capture
    # itself may be refused for lack of an engine, but not with 401).
    assert report["capture_without_token"] == 401
    assert report["capture_with_token"] != 401, log
    # 0700 for the directory, plus the setgid bit it inherits from an fsGroup volume (which the
    # agent's check, about who else may enter, rightly accepts).
    assert report["token_file"] == {"uid": spec["uid"], "mode": "0o600", "dir_mode": "0o2700"}
    assert report["running"], log
    assert not [line for line in log.splitlines() if any(f in line for f in WRITE_FAILURES)], log
    # It wrote its token, in its state volume, and nothing else anywhere it could.
    assert report["written"] == [spec["token_file"].lstrip("/")], report["written"]
