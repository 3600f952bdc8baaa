"""The serve pod's two containers, for real: `infersight serve` (tiny model, CPU) and its agent
sidecar, each from its manifest's command line, each in a pid and mount namespace of its own (as
two containers without shareProcessNamespace), sharing nothing but a fresh tmpfs bound onto
/dev/shm in both (the pod's emptyDir, medium: Memory) and the network (the pod's). Each is pid 1 in
its namespace, as a container's entrypoint is, so the engine's ring is `infersight-1` every time (named
after serve's pid; its writer is serve's engine process, a child of pid 1).

Checked, in order, on one pod:
  - requests sent through serve reach the agent: its /metrics and /api/v1/summary count exactly
    the requests the client saw answered;
  - the agent container restarts (SIGKILL, a new namespace, under a shell: not pid 1 there, while
    its predecessor's pid 1 is a live process of that namespace): the new agent takes the ring's
    lease over at once (the lease generation in the ring header goes up) and counts the requests
    sent meanwhile;
  - the engine container restarts (SIGKILL, a new namespace: pid 1 again, hence the same ring
    name): the agent, which cannot judge a pid of another namespace, declares the old ring dead by
    its writer's heartbeat and counts it; the new engine replaces the dead ring under its name; the
    agent attaches the new ring and counts its requests on top of the old ones;
  - the engine dies for good: its ring is detected dead, counted once, removed, and not read again.

Expected counts are the client's own (HTTP 200 answers); latencies are read on the test's clock on a
shared 2-core machine (noisy). Needs root and util-linux's unshare, as CI has (CI=true: a failure
when missing, else a skip).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest
from k8s_manifests import REPO, all_containers, infersight_argv
from prometheus_client.parser import text_string_to_metric_families
from testkit import free_port, require_service

from infersight.probes.ring_lease import LEASE_PID

RING = "infersight-1"  # the engine is pid 1 of its namespace; its ring is named after its pid
SERVE = next(c for c in all_containers() if c.workload == "infersight-serve" and not c.sidecar)
AGENT = next(c for c in all_containers() if c.workload == "infersight-serve" and c.sidecar)
#: A ring header's producer pid (offset 28) and wall-clock creation anchor (offset 32): schema._STATIC.
_PID_AND_ANCHOR = struct.Struct("<28xIq")


def _engine_pid(container: "PodContainer") -> int:
    """The engine process's pid in its container's namespace, as serve logged it when it was ready."""
    match = re.search(r"engine process (\d+) ready", container.log.read_text(errors="replace"))
    assert match, container.text()
    return int(match.group(1))


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "not root (pid and mount namespaces, a tmpfs mount)"
    return None if shutil.which("unshare") else "util-linux's unshare is missing"


class PodContainer:
    """One container: its own pid namespace (it is pid 1 there, /proc remounted for it) and mount
    namespace, in which the shared tmpfs is bound onto /dev/shm. Killing it kills its namespace."""

    def __init__(self, name: str, argv: list[str], shm: Path, env: dict[str, str], log_dir: Path,
                 pid1: bool = True) -> None:
        self.name, self.log = name, log_dir / f"{name}.log"
        # pid1=False: an entrypoint that runs infersight under a shell (the shell stays pid 1).
        script = 'mount --bind "$0" /dev/shm && ' + ('exec "$@"' if pid1 else '"$@"; exit $?')
        with open(self.log, "wb") as out:
            # --kill-child: the container's pid 1 dies with unshare, and the kernel kills the rest of its
            # pid namespace with it (the engine's resource tracker too, which would unlink its ring).
            self.proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c",
                                          script, str(shm), sys.executable, "-m", "infersight", *argv],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


def _environment(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "XDG_STATE_HOME": str(home / "state"),
            "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "CI": os.environ.get("CI", "")}


def _serve_argv(port: int) -> list[str]:
    """The manifest's serve command line, on a loopback port and the CPU."""
    argv = infersight_argv(SERVE) or []
    swap = {"--listen": f"127.0.0.1:{port}", "--device": "cpu"}
    return [f"{a.split('=')[0]}={swap[a.split('=')[0]]}" if a.split("=")[0] in swap else a for a in argv]


def _agent_argv(port: int, dcgm_port: int) -> list[str]:
    """The manifest's agent command line, on a loopback port, with no OTLP endpoint (no Collector
    here) and the node's dcgm-exporter at a port nothing listens on (logged and retried)."""
    out = []
    for a in infersight_argv(AGENT) or []:
        if a == "--otlp-endpoint":
            continue
        if a.startswith("--listen="):
            a = f"--listen=127.0.0.1:{port}"
        out.append(a.replace("$(NODE_IP):9400", f"127.0.0.1:{dcgm_port}"))
    return out


def _wait(what: str, check: Callable[[], object], timeout: float, logs: Callable[[], str]) -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})\n{logs()}")


def _metrics(url: str) -> dict[str, float]:
    """Sample name -> the sum of its samples over every label set."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def _complete(url: str, n: int, model: str) -> int:
    """Send n completions one after another; return how many were answered 200."""
    ok = 0
    with httpx.Client(timeout=60) as client:
        for i in range(n):
            r = client.post(f"{url}/v1/completions", json={"model": model, "prompt": f"request {i}", "max_tokens": 4})
            ok += r.status_code == 200
    return ok


def _header(shm: Path) -> tuple[int, int, int]:
    """(producer pid, creation anchor, lease word) of the ring as the tmpfs holds it now."""
    head = (shm / RING).read_bytes()[:192]
    pid, anchor = _PID_AND_ANCHOR.unpack_from(head)
    return pid, anchor, struct.unpack_from("<Q", head, 8 * LEASE_PID)[0]


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[dict]:
    why = _missing()
    if why:
        require_service("pid and mount namespaces (root, unshare)", why)
    shm = tmp_path / "shm"
    shm.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=1777", "tmpfs", str(shm)], check=True)
    containers: list[PodContainer] = []
    try:
        yield {"shm": shm, "env": _environment(tmp_path), "logs": tmp_path, "containers": containers}
    finally:
        for c in containers:
            c.kill()
        subprocess.run(["umount", "-l", str(shm)], check=False)


def test_serve_and_its_agent_in_two_containers(pod: dict) -> None:
    shm, env, logs, containers = pod["shm"], pod["env"], pod["logs"], pod["containers"]
    serve_port, agent_port, dcgm_port = free_port(), free_port(), free_port()
    serve_url, agent_url = f"http://127.0.0.1:{serve_port}", f"http://127.0.0.1:{agent_port}"
    model = next(a.split("=", 1)[1] for a in _serve_argv(serve_port) if a.startswith("--served-model-name="))

    def start(name: str, argv: list[str], pid1: bool = True) -> PodContainer:
        c = PodContainer(name, argv, shm, env, logs, pid1)
        containers.append(c)
        return c

    def all_logs() -> str:
        return "\n".join(f"--- {c.name}\n{c.text()}" for c in containers)

    def agent_counts(n: int) -> Callable[[], bool]:
        return lambda: _metrics(agent_url).get("infersight_requests_total") == n

    def rings_read() -> list[str]:
        return httpx.get(f"{agent_url}/health", timeout=10).json()["rings"]

    # -- the pod starts: the sidecar first (an init container), then the engine
    agent1 = start("agent-1", _agent_argv(agent_port, dcgm_port))
    engine1 = start("engine-1", _serve_argv(serve_port))
    _wait("serve answers /health", lambda: httpx.get(f"{serve_url}/health", timeout=5).status_code == 200, 180,
          all_logs)
    _wait("the agent reads the engine's ring", lambda: rings_read() == [RING], 60, all_logs)
    pid1, anchor1, lease1 = _header(shm)
    # the writer is serve's engine process (a child of the container's pid 1), by the pid serve logged
    # for it: a pid of a namespace the agent cannot see into
    assert pid1 == _engine_pid(engine1) != 1
    assert sorted(p.name for p in shm.iterdir()) == [RING, f"{RING}-ctl"]  # nothing else shared

    # -- the whole pipeline: what the client saw answered is what the agent counts
    sent1 = _complete(serve_url, 5, model)
    assert sent1 == 5
    _wait(f"the agent counts {sent1} requests", agent_counts(sent1), 60, all_logs)
    summary = httpx.get(f"{agent_url}/api/v1/summary", timeout=10).json()
    assert summary["requests"] == sent1
    assert list(summary["rings"]) == [RING]

    # -- the agent container restarts: the new agent, in a new namespace, takes the lease over at once.
    # It runs under a shell here, so it is not pid 1 there, while the dead agent's pid (1) is a live
    # process of the new namespace (the shell): the pid cannot be judged across namespaces, the free
    # lock decides.
    agent1.kill()
    assert lease1 & 0xFFFFFFFF == 1
    sent2 = _complete(serve_url, 4, model)  # read by nobody: they wait in the ring
    agent2 = start("agent-2", _agent_argv(agent_port, dcgm_port), pid1=False)
    _wait(f"the restarted agent counts the {sent2} requests sent while none ran", agent_counts(sent2), 90,
          all_logs)
    *_, lease2 = _header(shm)
    assert lease2 >> 32 == (lease1 >> 32) + 1 and lease2 & 0xFFFFFFFF != 1  # a takeover, by the new agent
    assert "already read by agent pid" not in agent2.text()  # never refused: no wait for the lease timeout
    assert _metrics(agent_url).get("infersight_probe_events_lost_total", 0) == 0  # agent 1 died idle

    # -- the engine container restarts: pid 1 again, the same ring name; the old ring's writer is dead
    engine1.kill()
    killed = time.monotonic()
    engine2 = start("engine-2", _serve_argv(serve_port))
    _wait("the agent counts the dead engine's ring", lambda: _metrics(agent_url).get(
        "infersight_probe_rings_dead_total") == 1, 60, all_logs)
    detected_s = time.monotonic() - killed
    _wait("the restarted serve answers /health", lambda: httpx.get(f"{serve_url}/health", timeout=5).status_code == 200,
          180, all_logs)
    _wait("the agent reads the new ring", lambda: rings_read() == [RING] and _header(shm)[1] != anchor1, 60, all_logs)
    # the new writer: the new serve's engine process, its own ring under the old name (serve is pid 1 again)
    assert _header(shm)[0] == _engine_pid(engine2)
    sent3 = _complete(serve_url, 3, model)
    _wait(f"the agent counts {sent2} + {sent3} requests", agent_counts(sent2 + sent3), 60, all_logs)
    assert httpx.get(f"{agent_url}/api/v1/summary", timeout=10).json()["requests"] == sent2 + sent3

    # -- the engine dies for good: detected, counted once, removed, not read again
    engine2.kill()
    killed = time.monotonic()
    _wait("the agent drops the dead engine's ring", lambda: rings_read() == [], 60, all_logs)
    final_detect_s = time.monotonic() - killed
    assert _metrics(agent_url).get("infersight_probe_rings_dead_total") == 2
    assert not (shm / RING).exists() and not (shm / f"{RING}-ctl").exists()
    time.sleep(3)  # discovery runs every 2 s: the removed ring is not found, nor counted, again
    assert rings_read() == [] and _metrics(agent_url).get("infersight_probe_rings_dead_total") == 2
    assert agent2.proc.poll() is None, all_logs()
    # Dead after 5 missed beats of 1 s, checked once a second on a ring quiet for a second: 4 to ~8 s.
    for took in (detected_s, final_detect_s):
        assert 4.0 <= took < 30.0, (detected_s, final_detect_s)
    print(f"dead ring detected {detected_s:.1f} s and {final_detect_s:.1f} s after the engine's SIGKILL (test clock)")
