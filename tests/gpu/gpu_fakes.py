"""Stand-ins for pynvml and DCGM's Python bindings: only what infersight.gpu calls, with the same
names, constants and return shapes, so the collectors run unchanged on a CPU-only machine."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


# -- NVML -----------------------------------------------------------------------------------------
class FakeNVMLError(Exception):
    """pynvml.NVMLError carries the NVML return code in .value."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpuState:
    uuid: str
    name: str = "NVIDIA H200"
    util_gpu: int = 0           # percent
    util_memory: int = 0        # percent
    mem_total: int = 150754820096
    mem_free: int = 150754820096
    mem_used: int = 0
    power_mw: int = 0
    energy_mj: int = 0
    sm_mhz: int = 0
    mem_mhz: int = 0
    temp_c: int = 0
    mem_temp_c: int | None = None  # None: the device answers NOT_SUPPORTED for the memory temperature field
    gpm_supported: bool = True
    gpm_values: dict[int, float] = field(default_factory=dict)  # GPM metric id -> percent or MiB/s
    not_supported: set[str] = field(default_factory=set)        # NVML function names that fail


class FakeGpmSample:
    def __init__(self, serial: int) -> None:
        self.serial = serial
        self.device: FakeGpuState | None = None
        self.taken_at = -1   # the fake's call counter at nvmlGpmSampleGet


class FakeGpmMetric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = -1
        self.value = float("nan")


class FakeGpmMetricsGet:
    """c_nvmlGpmMetricsGet_t: version, numMetrics, sample1, sample2, metrics[NVML_GPM_METRIC_MAX]."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeGpmSample | None = None
        self.sample2: FakeGpmSample | None = None
        self.metrics = [FakeGpmMetric() for _ in range(64)]


class FakeNvml:
    NVML_SUCCESS = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVML_FI_DEV_MEMORY_TEMP = 82
    NVML_VALUE_TYPE_UNSIGNED_INT = 1
    NVML_GPM_METRICS_GET_VERSION = 1
    # Same ids as pynvml's NVML_GPM_METRIC_* constants.
    NVML_GPM_METRIC_GRAPHICS_UTIL = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    NVML_GPM_METRIC_DRAM_BW_UTIL = 10
    NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
    NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
    NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60
    NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61
    NVMLError = FakeNVMLError
    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet

    def __init__(self, gpus: list[FakeGpuState]) -> None:
        self.gpus = gpus
        self.calls: Counter[str] = Counter()
        self.initialized = 0
        self.allocated: list[FakeGpmSample] = []
        self.freed: list[FakeGpmSample] = []
        self.lost = False  # set True to make every device call fail with GPU_IS_LOST

    def _call(self, name: str, dev: FakeGpuState | None = None) -> None:
        self.calls[name] += 1
        if self.initialized <= 0:
            raise FakeNVMLError(1)  # NVML_ERROR_UNINITIALIZED
        if dev is not None and self.lost:
            raise FakeNVMLError(self.NVML_ERROR_GPU_IS_LOST)
        if dev is not None and name in dev.not_supported:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self) -> None:
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpuState:
        self._call("nvmlDeviceGetHandleByIndex")
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, dev: FakeGpuState) -> str:
        self._call("nvmlDeviceGetUUID", dev)
        return dev.uuid

    def nvmlDeviceGetName(self, dev: FakeGpuState) -> bytes:
        self._call("nvmlDeviceGetName", dev)
        return dev.name.encode()  # older pynvml returned bytes; the collector accepts both

    def nvmlDeviceGetUtilizationRates(self, dev: FakeGpuState) -> SimpleNamespace:
        self._call("nvmlDeviceGetUtilizationRates", dev)
        return SimpleNamespace(gpu=dev.util_gpu, memory=dev.util_memory)

    def nvmlDeviceGetMemoryInfo(self, dev: FakeGpuState) -> SimpleNamespace:
        self._call("nvmlDeviceGetMemoryInfo", dev)
        return SimpleNamespace(total=dev.mem_total, free=dev.mem_free, used=dev.mem_used)

    def nvmlDeviceGetPowerUsage(self, dev: FakeGpuState) -> int:
        self._call("nvmlDeviceGetPowerUsage", dev)
        return dev.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, dev: FakeGpuState) -> int:
        self._call("nvmlDeviceGetTotalEnergyConsumption", dev)
        return dev.energy_mj

    def nvmlDeviceGetClockInfo(self, dev: FakeGpuState, clock_type: int) -> int:
        self._call("nvmlDeviceGetClockInfo", dev)
        return {self.NVML_CLOCK_SM: dev.sm_mhz, self.NVML_CLOCK_MEM: dev.mem_mhz}[clock_type]

    def nvmlDeviceGetTemperature(self, dev: FakeGpuState, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperature", dev)
        assert sensor == self.NVML_TEMPERATURE_GPU
        return dev.temp_c

    def nvmlDeviceGetFieldValues(self, dev: FakeGpuState, field_ids: list[int]) -> list[SimpleNamespace]:
        """c_nvmlFieldValue_t per field: each carries its own return code and a typed value union."""
        self._call("nvmlDeviceGetFieldValues", dev)
        out = []
        for field_id in field_ids:
            if field_id == self.NVML_FI_DEV_MEMORY_TEMP and dev.mem_temp_c is not None:
                out.append(SimpleNamespace(fieldId=field_id, nvmlReturn=self.NVML_SUCCESS,
                                           valueType=self.NVML_VALUE_TYPE_UNSIGNED_INT,
                                           value=SimpleNamespace(uiVal=dev.mem_temp_c)))
            else:
                out.append(SimpleNamespace(fieldId=field_id, nvmlReturn=self.NVML_ERROR_NOT_SUPPORTED, valueType=0,
                                           value=SimpleNamespace(dVal=0.0)))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, dev: FakeGpuState) -> list[Any]:
        raise AssertionError("the collector must never list processes")

    def nvmlGpmQueryDeviceSupport(self, dev: FakeGpuState) -> SimpleNamespace:
        self._call("nvmlGpmQueryDeviceSupport", dev)
        return SimpleNamespace(version=1, isSupportedDevice=int(dev.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        self._call("nvmlGpmSampleAlloc")
        sample = FakeGpmSample(len(self.allocated))
        self.allocated.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:
        self._call("nvmlGpmSampleFree")
        self.freed.append(sample)

    def nvmlGpmSampleGet(self, dev: FakeGpuState, sample: FakeGpmSample) -> FakeGpmSample:
        self._call("nvmlGpmSampleGet", dev)
        sample.device, sample.taken_at = dev, sum(self.calls.values())
        return sample

    def nvmlGpmMetricsGet(self, request: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        self._call("nvmlGpmMetricsGet")
        s1, s2 = request.sample1, request.sample2
        # What NVML requires: the versioned struct, two distinct samples of one device, in order.
        assert request.version == self.NVML_GPM_METRICS_GET_VERSION
        assert s1 is not None and s2 is not None and s1 is not s2
        assert s1.device is not None and s1.device is s2.device and s1.taken_at < s2.taken_at
        for metric in request.metrics[: request.numMetrics]:
            if metric.metricId in s1.device.gpm_values:
                metric.nvmlReturn, metric.value = self.NVML_SUCCESS, s1.device.gpm_values[metric.metricId]
            else:
                metric.nvmlReturn = self.NVML_ERROR_NOT_SUPPORTED
        return request


# -- DCGM -----------------------------------------------------------------------------------------
class FakeDCGMError(Exception):
    pass


@dataclass
class FakeFieldValue:
    """What DcgmFieldValue exposes: .value, .isBlank, .ts (usec)."""

    value: Any
    isBlank: bool = False
    ts: int = 0


class FakeDcgm:
    """Builds fake `pydcgm`, `dcgm_structs`, `dcgm_fields` modules over one host-engine state."""

    DCGM_FE_GPU = 1
    DCGM_FE_GPU_I = 4

    def __init__(self, gpus: dict[int, tuple[str, str]], values: dict[int, dict[int, dict[int, list[FakeFieldValue]]]],
                 running: bool = True) -> None:
        self.gpus = gpus            # gpu id -> (uuid, device name)
        self.values = values        # entity group -> entity id -> field id -> series
        self.running = running
        self.watched: list[tuple[list[int], int, float, int]] = []
        self.unwatched = 0
        self.deleted_groups = 0
        self.shutdowns = 0
        self.connects: list[dict[str, Any]] = []
        self.profiling: list[tuple[str, Any]] = []  # ("pause" | "resume", handle) in call order

    def bindings(self) -> Any:
        from infersight.gpu.dcgm_collector import DcgmBindings
        fake = self

        class FieldGroup:
            def __init__(self, handle: Any, name: str = "", fieldIds: list[int] | None = None) -> None:
                self.name, self.fieldIds = name, list(fieldIds or [])

            def Delete(self) -> None:
                fake.deleted_groups += 1

        class Samples:
            def WatchFields(self, fg: FieldGroup, freq_us: int, max_age_s: float, max_samples: int) -> None:
                fake.watched.append((fg.fieldIds, freq_us, max_age_s, max_samples))

            def UnwatchFields(self, fg: FieldGroup) -> None:
                fake.unwatched += 1

            def GetLatest_v2(self, fg: FieldGroup) -> SimpleNamespace:
                return SimpleNamespace(values=fake.values)

        class System:
            discovery = SimpleNamespace(
                GetAllSupportedGpuIds=lambda: sorted(fake.gpus),
                GetGpuAttributes=lambda g: SimpleNamespace(identifiers=SimpleNamespace(
                    uuid=fake.gpus[g][0].encode(), deviceName=fake.gpus[g][1].encode())))

            def GetDefaultGroup(self) -> SimpleNamespace:
                return SimpleNamespace(samples=Samples())

            def UpdateAllFields(self, wait: bool) -> None:
                pass

        class Handle:
            def __init__(self, ipAddress: str | None = None, opMode: int = 0, timeoutMs: int = 0) -> None:
                self.handle = f"handle-{len(fake.connects)}"
                fake.connects.append({"ipAddress": ipAddress, "opMode": opMode, "timeoutMs": timeoutMs})
                if not fake.running:
                    raise FakeDCGMError("Host engine connection invalid/disconnected")

            def GetSystem(self) -> System:
                return System()

            def Shutdown(self) -> None:
                fake.shutdowns += 1

        pydcgm = SimpleNamespace(DcgmHandle=Handle, DcgmFieldGroup=FieldGroup)
        structs = SimpleNamespace(DCGM_OPERATION_MODE_AUTO=1, DCGMError=FakeDCGMError)
        fields = SimpleNamespace(DCGM_FE_GPU=self.DCGM_FE_GPU, DCGM_FE_GPU_I=self.DCGM_FE_GPU_I)
        agent = SimpleNamespace(dcgmProfPause=lambda h: fake.profiling.append(("pause", h)),
                                dcgmProfResume=lambda h: fake.profiling.append(("resume", h)))
        return DcgmBindings(pydcgm=pydcgm, dcgm_structs=structs, dcgm_fields=fields, dcgm_agent=agent)
