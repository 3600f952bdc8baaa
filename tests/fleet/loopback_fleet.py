"""A fleet on loopback, as an SRE runs one, every part a real process:

    node-a: infersight serve --+-- infersight agent --- prometheus --enable-feature=agent --+
    node-b: infersight serve --+-- infersight agent --- prometheus --enable-feature=agent --+-> central prometheus
    node-c: infersight serve --+-- infersight agent --- prometheus --enable-feature=agent --+   (remote-write receiver,
                                      |  OTLP/HTTP                  external_labels: node       infersight's rule files)
                                      +---------------------------> Phoenix (one trace backend)

Each node's identity: its agent-mode Prometheus stamps `node` on everything it forwards (external
labels) and its agent's spans carry `k8s.node.name` in their OpenTelemetry resource
(OTEL_RESOURCE_ATTRIBUTES, as the Kubernetes downward API sets it), which the agent also serves as
target_info. The model is the agent's own `model_name` label (--model-name).

One node is slow the way a real node is: its engine has a KV pool so small that it preempts
(SLOW_NODE, KV blocks below). The fleet is started once by the module fixture and shared by every
check.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from testkit import free_port, unique_ring, wait_for_process

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "agent"))
from prometheus_server import PROMETHEUS, requires_prometheus  # noqa: E402,F401  (requires_prometheus: re-exported)

from infersight.exporters.rules import RulesConfig, write_rules  # noqa: E402

MODEL = "tiny-moe"
JOB = "infersight"
NODES = ("node-a", "node-b", "node-c")
#: The slow node, chosen here: the fleet view and the alert must find this one.
SLOW_NODE = "node-b"
#: The slow node's KV pool: 12 blocks of 16 tokens, one request of PROMPT + MAX_TOKENS takes up to 5,
#: so a batch of CONCURRENCY cannot hold and the scheduler preempts. The others hold a whole batch.
SLOW_KV_BLOCKS, KV_BLOCKS, MAX_MODEL_LEN = 12, 96, 192
REQUESTS_PER_NODE, CONCURRENCY, MAX_TOKENS = 12, 4, 24
#: Every agent's e2e objective: on this CPU every request passes it, so each agent flags requests
#: slow and the slow-cause mix has something in it on every node. No flight recorder: on a shared
#: 2-core CPU its captures hold an agent for tens of seconds (a /metrics answer took 145 s), so the
#: scrapes time out; the kernel panels are proven on one node (tests/dashboards).
AGENT_SLO_E2E_S = 0.25
SCRAPE_S = 5.0
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
       "OMP_NUM_THREADS": "1", "OTEL_BSP_SCHEDULE_DELAY": "200"}


def _stop(proc: subprocess.Popen | None, grace: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait(what: str, proc: subprocess.Popen, log: Path, check: Callable[[], bool], timeout: float) -> None:
    wait_for_process(proc, lambda: log.read_text()[-3000:], what, check, timeout,
                     transient=(httpx.HTTPError, ValueError, KeyError))


@dataclass
class Node:
    name: str
    kv_blocks: int
    work: Path
    ring: str = field(default_factory=lambda: unique_ring("fleet"))
    serve_port: int = field(default_factory=free_port)
    agent_port: int = field(default_factory=free_port)
    prom_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def serve_url(self) -> str:
        return f"http://127.0.0.1:{self.serve_port}"

    @property
    def agent_instance(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    def _spawn(self, role: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = self.work / f"{role}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=self.work, env=env or ENV, stdout=out, stderr=subprocess.STDOUT)
        self.procs[role] = proc
        return proc

    def start_engine(self) -> None:
        self._spawn("serve", [sys.executable, "-m", "infersight", "serve", "--model", MODEL, "--device", "cpu",
                              "--speculative-model", "tiny-draft", "--listen", f"127.0.0.1:{self.serve_port}",
                              "--ring", self.ring, "--num-kv-blocks", str(self.kv_blocks),
                              "--max-model-len", str(MAX_MODEL_LEN)])

    def wait_engine(self) -> None:
        _wait(f"{self.name}'s engine", self.procs["serve"], self.work / "serve.log",
              lambda: httpx.get(self.serve_url + "/health", timeout=1).status_code == 200, 300)

    def start_agent(self, otlp: str | None) -> None:
        # The node's identity on its spans, as the downward API would set it in a pod.
        env = {**ENV, "OTEL_RESOURCE_ATTRIBUTES": (f"k8s.node.name={self.name},host.name={self.name},"
                                                     f"service.instance.id={self.name}-agent")}
        self._spawn("agent", [sys.executable, "-m", "infersight", "agent", "--ring", self.ring,
                              "--listen", self.agent_instance, "--poll-interval", "0.25", "--model-name", MODEL,
                              *(["--otlp-endpoint", otlp] if otlp else []), "--slo-e2e-s", str(AGENT_SLO_E2E_S)],
                    env)

    def wait_agent(self) -> None:
        _wait(f"{self.name}'s agent", self.procs["agent"], self.work / "agent.log",
              lambda: httpx.get(f"http://{self.agent_instance}/health", timeout=1).json()["rings"] == [self.ring],
              60)

    def start_prometheus_agent(self, central: str) -> None:
        """Prometheus in agent mode: scrapes this node's agent, forwards everything to the central one
        with the node's name as an external label; it keeps no queryable store of its own."""
        config = self.work / "prometheus-agent.yml"
        config.write_text(f"""global:
  scrape_interval: {SCRAPE_S:g}s
  scrape_timeout: {SCRAPE_S:g}s
  external_labels:
    node: {self.name}
scrape_configs:
  - job_name: {JOB}
    static_configs:
      - targets: ['{self.agent_instance}']
remote_write:
  - url: {central}/api/v1/write
    queue_config:
      batch_send_deadline: 1s
      min_backoff: 100ms
      max_backoff: 1s
""")
        self._spawn("prometheus-agent", [PROMETHEUS, "--enable-feature=agent", f"--config.file={config}",
                                         f"--storage.agent.path={self.work / 'wal'}",
                                         f"--web.listen-address=127.0.0.1:{self.prom_port}"])

    def wait_prometheus_agent(self) -> None:
        _wait(f"{self.name}'s agent-mode Prometheus", self.procs["prometheus-agent"],
              self.work / "prometheus-agent.log",
              lambda: httpx.get(f"http://127.0.0.1:{self.prom_port}/-/ready", timeout=1).status_code == 200, 30)

    def stop(self) -> None:
        for role in ("prometheus-agent", "agent", "serve"):
            _stop(self.procs.get(role))


@dataclass
class Central:
    """The central Prometheus: a remote-write receiver that evaluates infersight's rule files."""

    work: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Path:
        rules = self.work / "rules"
        # The real rule files, written by the library call `infersight rules` makes (in-process: a CLI
        # child only re-imports the package). The agent targets are the job here (no pod, no container).
        write_rules(rules, RulesConfig(agent_selector=f'job="{JOB}"'))
        config = self.work / "prometheus.yml"
        config.write_text(f"""global:
  evaluation_interval: 1s
rule_files:
  - {rules}/*.rules.yml
""")
        log = self.work / "prometheus.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                                          f"--storage.tsdb.path={self.work / 'data'}",
                                          f"--web.listen-address=127.0.0.1:{self.port}",
                                          "--web.enable-remote-write-receiver"], stdout=out, stderr=subprocess.STDOUT)
        _wait("the central Prometheus", self.proc, log,
              lambda: httpx.get(self.url + "/-/ready", timeout=1).status_code == 200, 30)
        return rules

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr, **({"time": str(at)} if at is not None else {})}
        resp = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=10)
        body = resp.json()
        assert resp.status_code == 200 and body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def stop(self) -> None:
        _stop(self.proc)


@dataclass
class FleetRun:
    central: Central
    nodes: dict[str, Node]
    rules_dir: Path
    phoenix: str | None  # None: Phoenix missing (fanout["missing"] says why)
    sent: dict[str, int]
    fanout: dict[str, object]
    started: float


def complete(url: str, i: int, traceparent: str | None = None) -> dict:
    """One completion: a shared system prompt (prefix-cache hits) plus a per-request tail."""
    headers = {"x-infersight-task": ("code", "chat")[i % 2], **({"traceparent": traceparent} if traceparent else {})}
    prompt = "You are a careful assistant. Answer briefly and exactly. " * 2 + f"Request {i}: count to ten."
    resp = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True,
                                                     "seed": i, "temperature": 0.8}, headers=headers, timeout=180)
    resp.raise_for_status()
    return resp.json()


def drive_load(nodes: list[Node]) -> dict[str, int]:
    """The same load on every node, one node after another: REQUESTS_PER_NODE requests, CONCURRENCY at a time.
    Not all at once: three engines sharing this machine's two cores took turns by chance, and one suite run
    saw a healthy node's ITL p50 at twice its peers' (z 10.5): slower, truly, but not for a reason of its own."""
    def one_node(node: Node) -> int:
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            return len(list(pool.map(lambda i: complete(node.serve_url, i), range(REQUESTS_PER_NODE))))

    return {n.name: one_node(n) for n in nodes}


def fan_out(phoenix: str, nodes: list[Node]) -> dict[str, object]:
    """An app's one trace fanned out to two nodes: its own span (exported to Phoenix by its own
    tracer provider) is the parent of one completion on each node (W3C traceparent)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "fleet-app"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=phoenix + "/v1/traces")))
    with provider.get_tracer("fleet-test").start_as_current_span("fan_out") as span:
        ctx = span.get_span_context()
        parent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"
        with ThreadPoolExecutor(len(nodes)) as pool:
            answers = list(pool.map(lambda n: complete(n.serve_url, 1000, parent), nodes))
    provider.shutdown()
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
            "nodes": [n.name for n in nodes], "answers": answers}
