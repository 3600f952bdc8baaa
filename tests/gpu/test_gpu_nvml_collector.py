"""NvmlCollector against a fake pynvml: unit conversions, GPM windows >= 100 ms, unsupported
fields skipped once, errors propagated, handles released, processes never listed."""
from __future__ import annotations

import pytest
from gpu_fakes import FakeGpuState, FakeNvml, FakeNVMLError

from infersight.gpu.nvml_collector import NvmlCollector

MS = 1_000_000
MIB = 1024 * 1024


class Clock:
    def __init__(self, ns: int = 0) -> None:
        self.ns = ns

    def __call__(self) -> int:
        return self.ns


def h200(uuid: str = "GPU-h200-0", **kw: object) -> FakeGpuState:
    gpu = FakeGpuState(uuid=uuid, util_gpu=87, util_memory=40, mem_total=150754820096, mem_free=10 * 2**30,
                       mem_used=150754820096 - 10 * 2**30, power_mw=612_345, energy_mj=8_123_456_789,
                       sm_mhz=1980, mem_mhz=2619, temp_c=57,
                       gpm_values={1: 96.0, 2: 88.0, 3: 24.0, 5: 61.5, 10: 35.0, 20: 45.0, 21: 192.0, 60: 0.0, 61: 0.0})
    for k, v in kw.items():
        setattr(gpu, k, v)
    return gpu


def values(samples: list, gpu: int = 0) -> dict[str, float]:
    return {s.field: s.value for s in samples if s.gpu == gpu}


def test_basic_fields_in_base_units_and_gpm_after_100_ms() -> None:
    nvml, clock = FakeNvml([h200()]), Clock(1_000 * MS)
    c = NvmlCollector(nvml, clock=clock)
    first = c.poll()  # same instant as the first GPM sample: no GPM window yet
    v = values(first)
    assert v == pytest.approx({
        "utilization_ratio": 0.87, "memory_copy_utilization_ratio": 0.40,   # % -> ratio
        "memory_total_bytes": 150754820096, "memory_free_bytes": 10 * 2**30,
        "memory_used_bytes": 150754820096 - 10 * 2**30,                      # bytes already
        "power_watts": 612.345,                                               # mW -> W
        "energy_joules": 8_123_456.789,                                       # mJ -> J
        "sm_clock_hertz": 1.98e9, "memory_clock_hertz": 2.619e9,             # MHz -> Hz
        "temperature_celsius": 57.0})
    assert all(s.ts_ns == 1_000 * MS and s.uuid == "GPU-h200-0" for s in first)
    clock.ns += 99 * MS
    assert "tensor_active_ratio" not in values(c.poll())  # 99 ms: window too short
    assert nvml.calls["nvmlGpmMetricsGet"] == 0
    clock.ns += 1 * MS
    v = values(c.poll())  # 100 ms after the first sample
    assert v["gr_engine_active_ratio"] == pytest.approx(0.96)
    assert v["sm_active_ratio"] == pytest.approx(0.88)
    assert v["sm_occupancy_ratio"] == pytest.approx(0.24)
    assert v["tensor_active_ratio"] == pytest.approx(0.615)
    assert v["dram_active_ratio"] == pytest.approx(0.35)
    assert v["pcie_tx_bytes_per_second"] == 45 * MIB and v["pcie_rx_bytes_per_second"] == 192 * MIB  # MiB/s
    assert v["nvlink_tx_bytes_per_second"] == 0.0
    # The window restarts at the sample just taken: 50 ms later there is no GPM, 100 ms later there is.
    clock.ns += 50 * MS
    assert "sm_active_ratio" not in values(c.poll())
    clock.ns += 50 * MS
    assert "sm_active_ratio" in values(c.poll())
    assert nvml.calls["nvmlGpmMetricsGet"] == 2
    assert len(nvml.allocated) == 2  # two buffers, reused in turn
    c.close()
    c.close()
    assert set(map(id, nvml.freed)) == set(map(id, nvml.allocated)) and nvml.initialized == 0


def test_pre_hopper_gpu_has_no_gpm_and_unsupported_fields_are_skipped_once() -> None:
    old = h200("GPU-a100", name="NVIDIA A100", gpm_supported=False,
               not_supported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature"})
    nvml, clock = FakeNvml([h200("GPU-h200"), old]), Clock()
    c = NvmlCollector(nvml, clock=clock)
    for _ in range(3):
        clock.ns += 200 * MS
        samples = c.poll()
    v0, v1 = values(samples, 0), values(samples, 1)
    assert "tensor_active_ratio" in v0 and "tensor_active_ratio" not in v1
    assert "energy_joules" not in v1 and "temperature_celsius" not in v1 and "power_watts" in v1
    assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 3 + 1  # gpu 0 thrice, gpu 1 once
    assert nvml.calls["nvmlGpmSampleGet"] == 1 + 3                     # only gpu 0: first + 3 windows
    line = c.status_line()
    assert "2 GPU(s)" in line and "GPM on 1/2" in line and "energy" in line and "temperature" in line
    c.close()


def test_gpm_disabled_by_config_and_gpu_lost_propagates() -> None:
    nvml, clock = FakeNvml([h200()]), Clock()
    c = NvmlCollector(nvml, gpm=False, clock=clock)
    clock.ns += 500 * MS
    assert "sm_active_ratio" not in values(c.poll()) and nvml.calls["nvmlGpmSampleAlloc"] == 0
    assert "no GPM" in c.status_line()
    nvml.lost = True
    with pytest.raises(FakeNVMLError) as err:
        c.poll()
    assert err.value.value == nvml.NVML_ERROR_GPU_IS_LOST
    c.close()


def test_init_failure_shuts_nvml_down() -> None:
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise FakeNVMLError(999)

    nvml = Broken([h200()])
    with pytest.raises(FakeNVMLError):
        NvmlCollector(nvml)
    assert nvml.initialized == 0


def test_paused_gpm_takes_no_sample_and_restarts_its_window_on_resume() -> None:
    nvml, clock = FakeNvml([h200()]), Clock(1_000 * MS)
    c = NvmlCollector(nvml, clock=clock)
    c.set_profiling_paused(True)
    assert "GPM paused 1/1" in c.status_line()
    gets = nvml.calls["nvmlGpmSampleGet"]
    clock.ns += 500 * MS
    v = values(c.poll())
    assert "sm_active_ratio" not in v and v["power_watts"] == pytest.approx(612.345)  # device counters go on
    assert nvml.calls["nvmlGpmSampleGet"] == gets  # the performance monitors were left alone
    c.set_profiling_paused(False)
    clock.ns += 500 * MS
    assert "sm_active_ratio" not in values(c.poll())  # a fresh first sample, not a window over the pause
    assert nvml.calls["nvmlGpmSampleGet"] == gets + 1
    clock.ns += 100 * MS
    assert values(c.poll())["sm_active_ratio"] == pytest.approx(0.88)
    c.close()


def test_memory_temperature_is_a_field_value_and_skipped_once_where_unsupported() -> None:
    nvml, clock = FakeNvml([h200(mem_temp_c=48), h200("GPU-h200-1")]), Clock(1_000 * MS)
    c = NvmlCollector(nvml, gpm=False, clock=clock)
    samples = c.poll()
    assert values(samples, 0)["memory_temperature_celsius"] == 48.0  # the uint member of the value union
    assert "memory_temperature_celsius" not in values(samples, 1)  # its field answered NOT_SUPPORTED
    calls = nvml.calls["nvmlDeviceGetFieldValues"]
    c.poll()
    assert nvml.calls["nvmlDeviceGetFieldValues"] == calls + 1  # asked again on GPU 0 only
    assert "not supported: memory_temperature" in c.status_line()
    c.close()
