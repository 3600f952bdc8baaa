"""GPU telemetry in a pod, end to end: an engine whose GPU is named by CUDA_VISIBLE_DEVICES (as the
device plugin leaves it) writes its GPU records; the agent, a sidecar of pod inference/vllm-a
(OTEL_RESOURCE_ATTRIBUTES), reads the node's dcgm-exporter over HTTP (five GPUs, three pods, built
from the real L4 scrape) and keeps its engine's GPU only: the GPU families on /metrics, the energy
account behind energy per request. Every other GPU's counter rises ten times faster, so a leak shows."""
from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from node_scrape import NodeGpu, node_scrape, raw_series
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infersight.agent.config import AgentConfig
from infersight.agent.gpu_config import GpuConfig
from infersight.agent.service import Agent

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_workload import make_engine, run_workload, unique_ring  # noqa: E402

U = [f"GPU-00000000-0000-4000-8000-00000000001{i}" for i in range(5)]
OURS = U[2]
NODE = [NodeGpu(0, U[0], "other-7c9", "inference", "vllm"),
        NodeGpu(1, U[1]),                                   # not allocated
        NodeGpu(2, U[2], "vllm-a", "inference", "vllm"),    # ours: by UUID and by pod label
        NodeGpu(3, U[3], "vllm-a", "staging", "vllm"),      # our pod's name, another namespace
        NodeGpu(4, U[4], "batch-job", "research", "train")]
START_MJ = 4_742_776  # the fixture's counter


class NodeExporter:
    """The node's dcgm-exporter: serves the current scrape; `advance` moves every energy counter."""

    def __init__(self, l4_text: str) -> None:
        self.l4, self.energy = l4_text, {u: START_MJ for u in U}
        self.served: list[str] = []
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = node_scrape(exporter.l4, NODE, dict(exporter.energy))
                exporter.served.append(body)
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def advance(self, step: int) -> None:
        for u in U:
            self.energy[u] += (3 + step % 4) * 1000 * (1 if u == OURS else 10)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def pod(request):
    path = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "dcgm_exporter_l4.prom"
    if not path.is_file():
        pytest.skip(f"shared fixture {path} is absent (the ../shared checkout is missing)")
    exporter = NodeExporter(path.read_text())
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CUDA_VISIBLE_DEVICES", OURS)  # what the device plugin gives the engine's container
        env.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=vllm-a,k8s.namespace.name=inference")
        ring = unique_ring("gpupod")
        engine, probe = make_engine(ring)
        agent = Agent(AgentConfig(rings=[ring], port=0,
                                  gpu=GpuConfig(source="dcgm-exporter", url=exporter.url, interval_s=60)))  # the test takes the readings itself
        polls = [0]

        def poll() -> None:
            polls[0] += 1
            if polls[0] % 3 == 0:
                exporter.advance(polls[0])
                agent.gpu.poll_once()
            agent.poll_once()

        try:
            agent.gpu.poll_once()  # the account starts before the first step
            agent.poll_once()
            work = run_workload(engine, poll)
            exporter.advance(0)
            agent.close()  # the sampler's final reading, then every held row
            text = generate_latest(agent.registry).decode()
            yield work, agent, probe, exporter, text
        finally:
            agent.close()
            probe.close()
            exporter.close()


def test_the_engine_reports_the_gpu_it_was_given(pod) -> None:
    _, agent, probe, _, _ = pod
    assert probe.gpu_uuids == (OURS,)
    assert agent.gpu_selection.uuids == frozenset({OURS})
    assert agent.state.engine_on_gpu  # the speculation interval takes the CUDA model-error term


def test_an_engine_without_gpus_keeps_the_cpu_term() -> None:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU engine: no GPU records on its ring
        ring = unique_ring("nogpu")
        engine, probe = make_engine(ring)
        agent = Agent(AgentConfig(rings=[ring], port=0))
        try:
            run_workload(engine, agent.poll_once)
            agent.poll_once()
            assert probe.gpu_uuids == () and agent.state.ring_stats and not agent.state.engine_on_gpu
        finally:
            agent.close()
            probe.close()


def test_gpu_families_hold_the_engines_gpu_only(pod) -> None:
    *_, exporter, text = pod
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    power = fams["infersight_gpu_power_watts"].samples
    last = {labels["UUID"]: v for n, labels, v in raw_series(exporter.served[-1]) if n == "DCGM_FI_DEV_POWER_USAGE"}
    assert [(s.labels["uuid"], s.labels["gpu"], s.value) for s in power] == [(OURS, "2", last[OURS])]
    for fam in fams.values():
        if fam.name.startswith("infersight_gpu_"):
            assert {s.labels.get("uuid") for s in fam.samples} <= {OURS, None}, fam.name


def test_energy_per_request_is_split_from_the_engines_gpu_only(pod) -> None:
    work, agent, _, exporter, text = pod
    readings = [round(s.value * 1e6) for s in agent.gpu.recent() if s.field == "energy_joules"]
    assert {s.uuid for s in agent.gpu.recent()} == {OURS}
    # the served scrapes, read as text: our GPU's counter from the first reading to the last, in uJ
    ours = [v for body in exporter.served for n, labels, v in raw_series(body)
            if n == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" and labels["UUID"] == OURS]
    assert len(ours) == len(exporter.served) >= 5 and readings == [round(v * 1000) for v in ours]
    meter = agent.state.energy
    assert meter.requests_uj + meter.idle_uj == round((ours[-1] - ours[0]) * 1000)
    rows = list(agent.state.finished)
    assert sorted(r["request_id"] for r in rows) == sorted(work.prompts)
    assert meter.requests_uj == round(sum(r["energy_j"] * 1e6 for r in rows)) > 0
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    fed = sum(s.value for s in fams["infersight_energy_joules"].samples if s.name.endswith("_total"))
    assert fed == pytest.approx(meter.requests_uj / 1e6, rel=1e-12)
