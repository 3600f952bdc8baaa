"""The GPUs an engine reports (probes.gpu_uuids) and their way through the ring: CUDA_VISIBLE_DEVICES
as indices into NVML's list or as UUIDs, NVML's whole list when unset, none without NVML; the
observer's GPU records, read back by the agent's ring set (and again later, for a late reader)."""
from __future__ import annotations

import sys
from pathlib import Path

from gpu_fakes import FakeGpuState, FakeNvml

from infersight.agent.rings.ingest import MAX_GPUS_PER_RING, RingSet
from infersight.probes.config import ProbeConfig
from infersight.probes.gpu_uuids import visible_gpu_uuids
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import RecordKind

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testkit import unique_ring  # noqa: E402

NODE = [FakeGpuState(uuid=f"GPU-11111111-2222-4333-8444-55555555555{i}") for i in range(4)]


def test_indices_name_gpus_in_nvmls_order() -> None:
    nvml = FakeNvml(NODE)
    assert visible_gpu_uuids({"CUDA_VISIBLE_DEVICES": "2,0"}, nvml) == (NODE[2].uuid, NODE[0].uuid)
    assert nvml.initialized == 0  # shut down again


def test_unset_means_every_gpu_and_empty_means_none() -> None:
    assert visible_gpu_uuids({}, FakeNvml(NODE)) == tuple(g.uuid for g in NODE)
    assert visible_gpu_uuids({"CUDA_VISIBLE_DEVICES": ""}, FakeNvml(NODE)) == ()


def test_uuids_are_taken_as_given_and_cuda_stops_at_a_bad_entry() -> None:
    given = "GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee,MIG-aaaaaaaa-bbbb-4ccc-8ddd-ffffffffffff"
    assert visible_gpu_uuids({"CUDA_VISIBLE_DEVICES": given}, nvml=None) == tuple(given.split(","))
    assert visible_gpu_uuids({"CUDA_VISIBLE_DEVICES": "1,x,3"}, FakeNvml(NODE)) == (NODE[1].uuid,)
    assert visible_gpu_uuids({"CUDA_VISIBLE_DEVICES": "1,7"}, FakeNvml(NODE)) == (NODE[1].uuid,)


def test_no_nvml_no_gpus() -> None:
    class Broken:
        def nvmlInit(self) -> None:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    assert visible_gpu_uuids({"CUDA_VISIBLE_DEVICES": "0"}, Broken()) == ()


def test_gpu_records_reach_the_agents_ring_set() -> None:
    ring = unique_ring("gpuids")
    uuids = (NODE[3].uuid, NODE[1].uuid)
    probe = ProbeObserver(ProbeConfig(ring_name=ring, nvtx=False, gpu_uuids=uuids))
    rings = RingSet([ring], discover=False)
    try:
        rings.refresh()
        rings.read()
        assert rings.gpu_uuids() == frozenset(uuids)
        assert rings.attached[ring].gpu_uuids == set(uuids)
    finally:
        rings.close()
        probe.close()


def test_a_reader_that_attaches_later_learns_them_at_the_next_due_step(monkeypatch) -> None:
    """The records are written again once GPU_RECORD_EVERY_S has passed (here: at once), so an agent
    that replaced the first one (its records already consumed) learns the GPUs too."""
    import infersight.probes.observer as observer_module
    from infersight.runtime.stats import StepStats

    ring = unique_ring("gpulate")
    probe = ProbeObserver(ProbeConfig(ring_name=ring, nvtx=False, gpu_uuids=(NODE[0].uuid,)))
    try:
        first = RingSet([ring], discover=False)
        first.refresh()
        first.read()
        assert first.gpu_uuids() == {NODE[0].uuid}
        first.close()
        monkeypatch.setattr(observer_module, "GPU_RECORD_EVERY_S", 0.0)
        probe.on_step_end(StepStats(step_id=1, start_ns=0, end_ns=2**62))  # due: the step ends after the due time
        later = RingSet([ring], discover=False)
        later.refresh()
        later.read()
        assert later.gpu_uuids() == {NODE[0].uuid}
        later.close()
        none = ProbeObserver(ProbeConfig(ring_name=unique_ring("nogpu"), nvtx=False, gpu_uuids=()))
        assert none.gpu_uuids == ()
        none.close()
    finally:
        probe.close()


def test_a_ring_keeps_at_most_max_gpus() -> None:
    import numpy as np

    from infersight.agent.rings.ingest import AttachedRing
    from infersight.probes.records import record_dtype

    many = np.zeros(MAX_GPUS_PER_RING + 5, dtype=record_dtype(RecordKind.GPU))
    many["uuid"] = [f"GPU-{i:036d}".encode() for i in range(len(many))]
    attached = AttachedRing("r", 0, consumer=None)  # type: ignore[arg-type]  # note_gpus reads records only
    attached.note_gpus({int(RecordKind.GPU): many})
    assert len(attached.gpu_uuids) == MAX_GPUS_PER_RING


def test_the_vllm_writer_reports_its_gpus_too() -> None:
    """vLLM's ring writer (the stat logger's ring): GPU records when the ring is created."""
    from infersight.vllm.writer import VllmProbeSettings, VllmRingWriter

    ring = unique_ring("vllmgpu")
    settings = VllmProbeSettings(ProbeConfig(ring_name=ring, nvtx=False, gpu_uuids=(NODE[2].uuid,)))
    writer = VllmRingWriter(settings)
    rings = RingSet([ring], discover=False)
    try:
        assert writer.open()
        rings.refresh()
        rings.read()
        assert rings.gpu_uuids() == {NODE[2].uuid}
    finally:
        rings.close()
        writer.close()
