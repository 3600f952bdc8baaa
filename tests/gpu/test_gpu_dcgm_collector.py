"""DcgmCollector and its field mapping against fake DCGM bindings (pydcgm is not on this machine)."""
from __future__ import annotations

import importlib.util

import pytest
from gpu_fakes import FakeDcgm, FakeDCGMError, FakeFieldValue

from infersight.gpu.dcgm_collector import DcgmCollector, dcgm_values_to_samples, import_bindings

GPU, GPU_I = FakeDcgm.DCGM_FE_GPU, FakeDcgm.DCGM_FE_GPU_I
INT64_NOT_SUPPORTED = 0x7FFFFFFFFFFFFFF2


def fv(value: object, blank: bool = False) -> list[FakeFieldValue]:
    return [FakeFieldValue(0.0), FakeFieldValue(value, blank)]  # a series; the latest is last


VALUES = {
    GPU: {
        0: {155: fv(350.25), 156: fv(123_456_789), 203: fv(87), 252: fv(40960), 250: fv(143771), 100: fv(1980),
            150: fv(55), 1001: fv(0.9), 1002: fv(0.8), 1003: fv(0.3), 1004: fv(0.55), 1005: fv(0.42),
            1009: fv(1_000_000), 1010: fv(2_000_000),
            1011: fv(INT64_NOT_SUPPORTED, blank=True),   # flagged blank by the bindings
            1012: fv(INT64_NOT_SUPPORTED),               # a binding that forgot the flag: caught by value
            999: fv(1.0)},                               # a field we do not map
        1: {1004: fv(140737488355328.0, blank=True), 155: fv(71.5), 203: fv(None)},
    },
    GPU_I: {0: {1004: fv(0.99)}},  # MIG instance entities are not whole-GPU samples
}
GPUS = {0: ("GPU-aaaa", "NVIDIA H200"), 1: ("GPU-bbbb", "NVIDIA H200")}


def test_field_mapping_units() -> None:
    samples = dcgm_values_to_samples(VALUES, GPU, {0: "GPU-aaaa", 1: "GPU-bbbb"}, ts_ns=42)
    got = {(s.gpu, s.field): s.value for s in samples}
    assert got == pytest.approx({
        (0, "power_watts"): 350.25,                         # 155, W
        (0, "energy_joules"): 123_456.789,                  # 156, mJ -> J
        (0, "utilization_ratio"): 0.87,                     # 203, % -> ratio
        (0, "memory_used_bytes"): 40960 * 1024 * 1024,      # 252, MiB -> bytes
        (0, "memory_total_bytes"): 143771 * 1024 * 1024,    # 250
        (0, "sm_clock_hertz"): 1.98e9,                      # 100, MHz -> Hz
        (0, "temperature_celsius"): 55.0,                   # 150
        (0, "gr_engine_active_ratio"): 0.9, (0, "sm_active_ratio"): 0.8, (0, "sm_occupancy_ratio"): 0.3,
        (0, "tensor_active_ratio"): 0.55, (0, "dram_active_ratio"): 0.42,     # 1001-1005 ratios
        (0, "pcie_tx_bytes_per_second"): 1e6, (0, "pcie_rx_bytes_per_second"): 2e6,  # 1009/1010
        (1, "power_watts"): 71.5,
    })
    assert {s.uuid for s in samples if s.gpu == 1} == {"GPU-bbbb"} and {s.ts_ns for s in samples} == {42}


def test_collector_watches_polls_and_releases() -> None:
    fake = FakeDcgm(GPUS, VALUES)
    c = DcgmCollector("10.0.0.5", update_interval_s=0.5, bindings=fake.bindings(), clock=lambda: 7)
    assert fake.connects == [{"ipAddress": "10.0.0.5", "opMode": 1, "timeoutMs": 1000}]
    (field_ids, freq_us, _, _), = fake.watched
    assert {155, 203, 252, 1001, 1002, 1003, 1004, 1005, 1009, 1010, 1011, 1012} <= set(field_ids)
    assert freq_us == 500_000
    samples = c.poll()
    assert len(samples) == 15 and {s.ts_ns for s in samples} == {7}
    assert "2 GPU(s) (NVIDIA H200)" in c.status_line()
    c.close()
    c.close()
    assert (fake.unwatched, fake.deleted_groups, fake.shutdowns) == (1, 1, 1)


def test_no_host_engine_raises() -> None:
    fake = FakeDcgm(GPUS, VALUES, running=False)
    with pytest.raises(FakeDCGMError):
        DcgmCollector(bindings=fake.bindings())
    assert fake.shutdowns == 0  # the handle never opened


@pytest.mark.skipif(importlib.util.find_spec("pydcgm") is not None, reason="DCGM bindings are installed here")
def test_missing_bindings_say_how_to_fix() -> None:
    with pytest.raises(ImportError, match="PYTHONPATH"):
        import_bindings()


def test_profiling_pause_is_dcgm_prof_pause_on_our_handle() -> None:
    fake = FakeDcgm(GPUS, VALUES)
    c = DcgmCollector(bindings=fake.bindings(), clock=lambda: 7)
    c.set_profiling_paused(True)
    c.set_profiling_paused(False)
    assert fake.profiling == [("pause", "handle-0"), ("resume", "handle-0")]
    c.close()


def test_profiling_pause_without_dcgm_agent_says_so() -> None:
    import dataclasses

    fake = FakeDcgm(GPUS, VALUES)
    c = DcgmCollector(bindings=dataclasses.replace(fake.bindings(), dcgm_agent=None), clock=lambda: 7)
    with pytest.raises(RuntimeError, match="dcgm_agent is not importable"):
        c.set_profiling_paused(True)
    c.close()
