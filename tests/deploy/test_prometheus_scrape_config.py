"""deploy/kubernetes/prometheus/prometheus.yml, the scrape config for clusters without the
Prometheus Operator: checked by the real promtool, and its relabelling run by a real Prometheus
over the targets pod discovery would make of the two Deployments, one of them scraping a real agent.

Debian's Prometheus (the one `make services` installs) is built without Kubernetes discovery, so
its promtool rejects kubernetes_sd_configs as an unknown field. Where that is so, the blocks are
checked for the fields and roles Prometheus documents and replaced by file_sd_configs for promtool
and the server; everything else in the file (jobs, relabel rules, their regexes) is checked as
written. A promtool that knows Kubernetes discovery checks the file unchanged.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from k8s_manifests import SCRAPE_CONFIG, workloads
from pod_discovery import Pod, pod_targets
from testkit import free_port, needs_service, unique_ring, wait_for_process

from infersight.bench.agent import stop_agent

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
needs_promtool = needs_service("promtool", Path(PROMTOOL).exists(),
                               "no promtool (/usr/bin/promtool; `make services` installs Debian's prometheus)")
needs_prometheus = needs_service("Prometheus", Path(PROMETHEUS).exists(),
                                 "no Prometheus server binary (/usr/bin/prometheus; `make services` installs it)")

#: kubernetes_sd_config's fields and roles, from the Prometheus configuration docs.
K8S_SD_FIELDS = {"api_server", "role", "namespaces", "selectors", "attach_metadata", "kubeconfig_file",
                 "basic_auth", "authorization", "oauth2", "proxy_url", "follow_redirects", "enable_http2",
                 "tls_config"}
K8S_SD_ROLES = {"node", "service", "pod", "endpoints", "endpointslice", "ingress"}
NO_K8S_SD = "field kubernetes_sd_configs not found"


def config() -> dict[str, Any]:
    return yaml.safe_load(SCRAPE_CONFIG.read_text())


def with_file_sd(cfg: dict[str, Any], targets_file: Path, interval: str | None = None) -> dict[str, Any]:
    """``cfg`` with each job's kubernetes_sd_configs (checked here) replaced by one file_sd_config."""
    out = json.loads(json.dumps(cfg))
    for job in out["scrape_configs"]:
        for sd in job.pop("kubernetes_sd_configs"):
            assert set(sd) <= K8S_SD_FIELDS and sd["role"] in K8S_SD_ROLES, (job["job_name"], sd)
        job["file_sd_configs"] = [{"files": [str(targets_file)]}]
    if interval:
        out["global"].update(scrape_interval=interval, scrape_timeout=interval)
    return out


def promtool_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_scrape_config(tmp_path: Path) -> None:
    as_shipped = promtool_check(SCRAPE_CONFIG)
    if as_shipped.returncode == 0:
        return  # a promtool with Kubernetes discovery checked the file itself
    assert NO_K8S_SD in as_shipped.stdout + as_shipped.stderr, as_shipped.stdout + as_shipped.stderr
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(with_file_sd(config(), targets)))
    result = promtool_check(checked)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_check_has_teeth(tmp_path: Path) -> None:
    """A broken relabel regex in the same config is refused by the same check."""
    cfg = config()
    cfg["scrape_configs"][0]["relabel_configs"][0]["regex"] = "infersight("
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    broken = tmp_path / "prometheus.yml"
    broken.write_text(yaml.safe_dump(with_file_sd(cfg, targets)))
    assert promtool_check(broken).returncode != 0


def _pods() -> list[Pod]:
    """A running pod of each Deployment, and a finished one of the first (which must be dropped)."""
    out = []
    for w in workloads():
        template = w.doc["spec"]["template"]
        name = w.doc["metadata"]["name"]
        out.append(Pod(f"{name}-7d9f-abcde", "inference", "127.0.0.1", "Running", "gpu-node-1",
                       template["metadata"]["labels"], template["spec"]))
    first = out[0]
    out.append(Pod(first.name.replace("abcde", "old00"), first.namespace, first.ip, "Succeeded", first.node,
                   first.labels, first.spec))
    return out


def _start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


@needs_prometheus
def test_prometheus_relabels_pod_targets_to_the_agents(tmp_path: Path) -> None:
    pods = _pods()
    running = pods[0]
    agent_port = free_port()
    # Every declared port gets a loopback address of its own (nothing listens on most: their health
    # is not asserted); the running vLLM pod's agent port is a real agent's.
    addresses = {(p.name, c["name"], port["name"]): f"127.0.0.1:{free_port()}"
                 for p in pods for c in [*p.spec["containers"], *p.spec["initContainers"]] for port in c["ports"]}
    addresses[(running.name, "infersight-agent", "infersight")] = f"127.0.0.1:{agent_port}"
    groups = [{"targets": [t.pop("__address__")], "labels": t}
              for p in pods for t in pod_targets(p, {k[1:]: v for k, v in addresses.items() if k[0] == p.name})]
    targets_file = tmp_path / "targets.json"
    targets_file.write_text(json.dumps(groups))
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(with_file_sd(config(), targets_file, interval="1s")))

    agent_log, prom_log = tmp_path / "agent.log", tmp_path / "prometheus.log"
    agent = _start([sys.executable, "-m", "infersight", "agent", "--ring", unique_ring("k8s-scrape"),
                    "--listen", f"127.0.0.1:{agent_port}", "--gpu-source", "none"], agent_log,
                   env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    web = free_port()
    prom = None
    try:
        wait_for_process(agent, agent_log.read_text, "the agent's /health",
                         lambda: httpx.get(f"http://127.0.0.1:{agent_port}/health", timeout=1).status_code == 200,
                         timeout=60, transient=(httpx.HTTPError,))
        prom = _start([PROMETHEUS, f"--config.file={config_file}", f"--storage.tsdb.path={tmp_path / 'data'}",
                       f"--web.listen-address=127.0.0.1:{web}"], prom_log)

        def agent_scraped() -> list[dict] | None:
            active = httpx.get(f"http://127.0.0.1:{web}/api/v1/targets", timeout=2).json()["data"]["activeTargets"]
            up = [t for t in active if t["labels"].get("instance") == f"127.0.0.1:{agent_port}" and t["health"] == "up"]
            return active if up else None

        # ValueError: until it is ready Prometheus answers its API with a plain-text 503, not JSON
        # (seen once in a full-suite run).
        active = wait_for_process(prom, prom_log.read_text, "Prometheus to scrape the agent", agent_scraped,
                                  timeout=60, transient=(httpx.HTTPError, KeyError, ValueError))
    finally:
        if prom is not None:
            stop_agent(prom)  # SIGTERM, then SIGKILL: any process
        stop_agent(agent)

    got = {(t["labels"]["job"], t["labels"]["namespace"], t["labels"]["pod"], t["labels"]["container"],
            t["labels"]["instance"]) for t in active}  # type: ignore[union-attr]
    # Expected from the manifests: every agent port (named infersight, on the sidecar) of a running
    # pod; serve's own API port; nothing of vLLM's API port or of the finished pod.
    want = set()
    for p in pods:
        if p.phase != "Running":
            continue
        for c in [*p.spec["containers"], *p.spec["initContainers"]]:
            for port in c["ports"]:
                job = ("infersight-agent" if port["name"] == "infersight" else
                       "infersight-serve" if p.labels["app.kubernetes.io/name"] == "infersight-serve" else None)
                if job:
                    want.add((job, p.namespace, p.name, c["name"], addresses[(p.name, c["name"], port["name"])]))
    assert {w[0] for w in want} == {"infersight-agent", "infersight-serve"} and len(want) == 3
    assert got == want
    # No discovery label leaks into the stored series' labels beyond the ones the config sets.
    for t in active:  # type: ignore[union-attr]
        assert set(t["labels"]) == {"job", "instance", "namespace", "pod", "container"}, t["labels"]
