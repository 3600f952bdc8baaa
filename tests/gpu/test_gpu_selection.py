"""A node's dcgm-exporter scrape (several GPUs, several pods, built from the real L4 scrape) filtered
to one engine's GPUs: by the UUIDs the engine reported, by dcgm-exporter's pod labels, or both.
Expected values are read from the raw scrape text with regexes (node_scrape.raw_series)."""
from __future__ import annotations

import pytest
from node_scrape import NodeGpu, node_scrape, raw_series

from infersight.gpu.exporter_collector import DcgmExporterCollector
from infersight.gpu.exporter_text import parse_exposition
from infersight.gpu.selection import GpuSelection

U = [f"GPU-00000000-0000-4000-8000-00000000000{i}" for i in range(5)]
NODE = [NodeGpu(0, U[0], "other-7c9", "inference", "vllm"),
        NodeGpu(1, U[1], "vllm-a", "inference", "vllm"),
        NodeGpu(2, U[2]),                                          # not allocated to any pod
        NodeGpu(3, U[3], "vllm-a", "staging", "vllm"),             # the same pod name, another namespace
        NodeGpu(4, U[4], "vllm-a", "inference", "vllm")]


@pytest.fixture
def scrape(shared_fixture) -> str:
    return node_scrape(shared_fixture("dcgm_exporter_l4.prom"), NODE)


def _raw_by_uuid(text: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, labels, value in raw_series(text):
        out.setdefault(labels["UUID"], {})[name] = value
    return out


def _kept(text: str, selection: GpuSelection) -> set[str]:
    return {s.uuid for s in parse_exposition(text, 0, selection).samples}


def test_the_built_scrape_is_the_fixture_per_gpu(scrape: str, shared_fixture) -> None:
    one = raw_series(shared_fixture("dcgm_exporter_l4.prom"))
    many = raw_series(scrape)
    assert len(one) == 23 and len(many) == 23 * len(NODE)  # 23 families, one sample each, per GPU
    assert {labels["UUID"] for _, labels, _ in many} == set(U)


def test_by_uuid(scrape: str) -> None:
    parsed = parse_exposition(scrape, 0, GpuSelection(uuids=[U[1], U[2]]))
    raw = _raw_by_uuid(scrape)
    assert {s.uuid for s in parsed.samples} == {U[1], U[2]}
    assert {key[1] for key in parsed.gpus} == {U[1], U[2]}
    # every series of the other GPUs is counted as left out, and only those
    assert parsed.not_selected == {u: len(raw[u]) for u in (U[0], U[3], U[4])}
    power = {s.uuid: s.value for s in parsed.samples if s.field == "power_watts"}
    assert power == {u: raw[u]["DCGM_FI_DEV_POWER_USAGE"] for u in (U[1], U[2])}
    energy = {s.uuid: s.value for s in parsed.samples if s.field == "energy_joules"}
    assert energy == {u: raw[u]["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] / 1000 for u in (U[1], U[2])}  # mJ -> J


def test_by_pod_labels(scrape: str) -> None:
    """Our pod in our namespace: not the same pod name in another namespace, nor the unallocated GPU."""
    assert _kept(scrape, GpuSelection("vllm-a", "inference")) == {U[1], U[4]}
    assert _kept(scrape, GpuSelection("vllm-a", "staging")) == {U[3]}


def test_by_uuid_and_pod(scrape: str) -> None:
    assert _kept(scrape, GpuSelection("vllm-a", "inference", [U[2]])) == {U[1], U[2], U[4]}


def test_nothing_known_keeps_every_gpu(scrape: str) -> None:
    assert _kept(scrape, GpuSelection()) == set(U)
    assert {s.uuid for s in parse_exposition(scrape, 0).samples} == set(U)


def test_in_a_pod_before_the_engine_reports_without_pod_labels_nothing_is_kept(shared_fixture) -> None:
    """An exporter without its Kubernetes mapping: until the engine names its GPUs, none is ours."""
    plain = node_scrape(shared_fixture("dcgm_exporter_l4.prom"), [NodeGpu(0, U[0]), NodeGpu(1, U[1])])
    selection = GpuSelection("vllm-a", "inference")
    collector = DcgmExporterCollector("http://node:9400/metrics", opener=lambda url, t: _Body(plain),
                                      selection=selection)
    assert collector.poll() == []  # not an error: the scrape was good, nothing in it is ours yet
    assert "2 other GPU(s) of the node left out" in collector.status_line()
    selection.set_uuids([U[1]])
    assert {s.uuid for s in collector.poll()} == {U[1]}
    assert "1 engine GPU UUID(s), pod inference/vllm-a" in collector.status_line()


def test_mig_fixture_series_follow_their_gpu(shared_fixture) -> None:
    """The A100 MIG scrape: the whole GPU and its MIG instance share one UUID, so both go together."""
    text = shared_fixture("dcgm_exporter_a100_mig.prom")
    (uuid,) = {labels["UUID"] for _, labels, _ in raw_series(text)}
    kept = parse_exposition(text, 0, GpuSelection(uuids=[uuid]))
    assert {s.instance for s in kept.samples} == {"", "13"}
    left = parse_exposition(text, 0, GpuSelection(uuids=[U[0]]))
    assert left.samples == [] and left.not_selected == {uuid: len(raw_series(text))}


class _Body:
    status = 200

    def __init__(self, text: str) -> None:
        self._data = text.encode()

    def read(self, amt: int = -1) -> bytes:
        return self._data

    def close(self) -> None:
        pass
