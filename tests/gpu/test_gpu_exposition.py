"""gpu_metric_families through a fresh CollectorRegistry, and the GPU block of the catalogue."""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from infersight.exporters import catalogue as C
from infersight.gpu.exposition import gpu_metric_families
from infersight.gpu.fields import FIELDS
from infersight.gpu.sampler import GpuSampler
from infersight.gpu.samples import GpuSample

SAMPLES = [
    GpuSample(0, "GPU-a", "power_watts", 300.0, 10),
    GpuSample(0, "GPU-a", "power_watts", 310.0, 20),       # newer: wins
    GpuSample(1, "GPU-b", "power_watts", 70.0, 20),
    GpuSample(0, "GPU-a", "energy_joules", 5000.5, 20),
    GpuSample(0, "GPU-a", "tensor_active_ratio", 0.5, 20),
    GpuSample(0, "GPU-a", "tensor_active_ratio", 0.9, 20, instance="2"),  # MIG: not exposed
    GpuSample(0, "GPU-a", "not_a_field", 1.0, 20),          # no catalogue entry: skipped
]


class _Collector:
    def __init__(self, source: object, errors: dict[str, int] | None = None) -> None:
        self.source, self.errors = source, errors

    def collect(self) -> Iterator[Metric]:
        yield from gpu_metric_families(self.source, self.errors)  # type: ignore[arg-type]


def registry(source: object, errors: dict[str, int] | None = None) -> CollectorRegistry:
    r = CollectorRegistry(auto_describe=False)
    r.register(_Collector(source, errors))
    return r


def test_latest_values_become_labelled_families() -> None:
    r = registry(SAMPLES, {"nvml": 2})
    get = r.get_sample_value
    assert get("infersight_gpu_power_watts", {"gpu": "0", "uuid": "GPU-a"}) == 310.0
    assert get("infersight_gpu_power_watts", {"gpu": "1", "uuid": "GPU-b"}) == 70.0
    assert get("infersight_gpu_energy_joules_total", {"gpu": "0", "uuid": "GPU-a"}) == 5000.5
    assert get("infersight_gpu_tensor_active_ratio", {"gpu": "0", "uuid": "GPU-a"}) == 0.5
    assert get("infersight_gpu_collector_errors_total", {"collector": "nvml"}) == 2.0
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(r).decode())}
    assert set(families) == {"infersight_gpu_power_watts", "infersight_gpu_energy_joules",
                             "infersight_gpu_tensor_active_ratio", "infersight_gpu_collector_errors"}
    assert families["infersight_gpu_energy_joules"].type == "counter"
    assert len(families["infersight_gpu_tensor_active_ratio"].samples) == 1  # the MIG series stays out


def test_sampler_as_source() -> None:
    class One:
        name = "dcgm-exporter"

        def poll(self) -> list[GpuSample]:
            return SAMPLES[:3]

        def close(self) -> None:
            pass

        def status_line(self) -> str:
            return ""

    sampler = GpuSampler(One())
    sampler.poll_once()
    r = registry(sampler)
    assert r.get_sample_value("infersight_gpu_power_watts", {"gpu": "0", "uuid": "GPU-a"}) == 310.0
    assert r.get_sample_value("infersight_gpu_collector_errors_total", {"collector": "dcgm-exporter"}) == 0.0
    assert list(gpu_metric_families([])) == []  # nothing known, no error counts: no families


def test_catalogue_gpu_block_matches_the_field_vocabulary() -> None:
    specs = {m.name: m for m in C.GPU_METRICS}
    assert len(specs) == len(C.GPU_METRICS)
    non_gpu = [m for m in C.CATALOGUE if m not in C.GPU_METRICS]
    assert not set(specs) & {m.name for m in non_gpu}
    assert all(any(m is c for c in C.CATALOGUE) for m in C.GPU_METRICS)  # part of the one catalogue
    for f in FIELDS:
        spec = specs["infersight_gpu_" + f.name]
        assert (spec.kind, spec.unit, spec.labels) == (f.kind, f.unit, ("gpu", "uuid")), f.name
    errors = specs.pop("infersight_gpu_collector_errors")
    assert (errors.kind, errors.labels, errors.sample) == \
        ("counter", ("collector",), "infersight_gpu_collector_errors_total")
    assert len(specs) == len(FIELDS)
    assert all(not m.name.endswith("_total") and ":" not in m.name for m in C.GPU_METRICS)
