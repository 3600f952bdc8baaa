"""Every `infersight ...` command line in deploy/kubernetes/ parses with infersight's own parser (a
flag renamed in code fails here, not in a cluster), and the two containers of each pod agree on
the addresses, ports and names that connect them."""
from __future__ import annotations

import argparse
import importlib
import json
from urllib.parse import urlsplit

import pytest
from k8s_manifests import Container, all_containers, containers, infersight_argv, workloads

from infersight.cli import build_parser
from infersight.commands.agent import parse_listen
from infersight.vllm.experts import worker_ring_name
from infersight.vllm.writer import VllmProbeSettings

INFERSIGHT = [c for c in all_containers() if infersight_argv(c) is not None]


def parse(argv: list[str]) -> argparse.Namespace:
    """argv through build_parser(); a usage error (argparse exits 2) becomes a test failure."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"`infersight {' '.join(argv)}` does not parse (exit {exc.code})")


def test_each_pod_runs_the_agent_as_a_native_sidecar() -> None:
    for workload in workloads():
        sidecars = [c for c in containers(workload) if c.sidecar]
        assert [infersight_argv(c)[0] for c in sidecars] == ["agent"], workload.name  # type: ignore[index]
    # vLLM's agent, infersight serve's agent and the serve engine itself.
    assert sorted(infersight_argv(c)[0] for c in INFERSIGHT) == ["agent", "agent", "serve"]  # type: ignore[index]


@pytest.mark.parametrize("container", INFERSIGHT, ids=lambda c: c.name)
def test_command_line_parses(container: Container) -> None:
    argv = infersight_argv(container)
    assert argv is not None
    args = parse(argv)
    assert args.command == argv[0]
    host, port = parse_listen(args.listen)
    # Listening beyond loopback is what lets Prometheus (agent) and the Service (engine) in.
    assert host == "0.0.0.0"
    declared = {p["containerPort"] for p in container.spec["ports"]}
    assert port in declared, f"{container.name} listens on {port}, declares {declared}"


def test_a_renamed_flag_fails_the_parse() -> None:
    """The check is not vacuous: the sidecar's own command line with one flag renamed (as a rename in
    infersight/commands/agent.py would leave the manifest) is refused by the parser."""
    argv = infersight_argv(next(c for c in INFERSIGHT if c.sidecar))
    assert argv is not None and any(a.startswith("--listen=") for a in argv)
    renamed = [a.replace("--listen=", "--listen-address=") for a in argv]
    with pytest.raises(pytest.fail.Exception, match="does not parse"):
        parse(renamed)


def _endpoint(url: str) -> tuple[str, int]:
    """(host, port) of tcp://H:P, http://H:P/..., or a bare H:P."""
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    assert parts.hostname is not None and parts.port is not None, url
    return parts.hostname, parts.port


def env_of(container: Container) -> list[tuple[str, str]]:
    """The container's literal environment (INFERSIGHT_RING there would rename the ring)."""
    return [(e["name"], e["value"]) for e in container.spec.get("env", []) if "value" in e]


def _flags(argv: list[str]) -> dict[str, str]:
    """--name=value pairs of a command line (vLLM's, which infersight's parser does not know)."""
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def test_vllm_and_its_agent_agree_on_every_loopback_endpoint() -> None:
    """vLLM's flags (parsed as vLLM reads them: --kv-events-config is JSON) against the agent's."""
    pod = {c.spec["name"]: c for c in containers(next(w for w in workloads() if w.doc["metadata"]["name"] == "vllm"))}
    agent = parse(infersight_argv(pod["infersight-agent"]) or [])
    vllm = _flags(pod["vllm"].argv())
    events = json.loads(vllm["kv-events-config"])
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    # The agent binds the events endpoint and vLLM connects (non-wildcard); the replay endpoint is vLLM's.
    assert _endpoint(events["endpoint"]) == _endpoint(agent.vllm_kv_events) == ("127.0.0.1", 5557)
    assert _endpoint(events["replay_endpoint"]) == _endpoint(agent.vllm_kv_replay)
    assert events["topic"] == agent.vllm_kv_topic
    # vLLM's spans (OTLP/gRPC, its default protocol) go to the agent's gRPC receiver.
    assert _endpoint(vllm["otlp-traces-endpoint"]) == _endpoint(agent.otlp_receiver_grpc)
    # The agent scrapes vLLM's /metrics on the port vLLM serves.
    assert _endpoint(agent.vllm_url)[1] == int(vllm["port"])
    # vLLM imports --middleware by its dotted path: it must name a class of the package.
    module, _, attr = vllm["middleware"].rpartition(".")
    assert isinstance(getattr(importlib.import_module(module), attr), type), vllm["middleware"]
    # The plugins' rings, named as they name them (pid 1: vLLM as a container's first process).
    rings = [VllmProbeSettings.from_env(dict(env_of(pod["vllm"])), 1).probe.ring_name, worker_ring_name(1)]
    assert all(r.startswith(agent.discover_prefix) for r in rings), (rings, agent.discover_prefix)
    assert agent.model_name == vllm["served-model-name"]


def test_serve_and_its_agent_share_the_ring_namespace() -> None:
    pod = {c.spec["name"]: c for c in containers(next(w for w in workloads()
                                                      if w.doc["metadata"]["name"] == "infersight-serve"))}
    engine = parse(infersight_argv(pod["engine"]) or [])
    agent = parse(infersight_argv(pod["infersight-agent"]) or [])
    assert not engine.with_agent  # the sidecar is the agent
    # The engine's ring is infersight-<pid> unless named; --discover attaches every infersight-* ring.
    assert engine.ring is None and agent.discover
