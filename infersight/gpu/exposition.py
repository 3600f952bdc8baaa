"""GPU telemetry as Prometheus metric families, built fresh per scrape from the catalogue.

Custom-collector style: an agent collector can `yield from gpu_metric_families(sampler)`. Names,
help and label names come from `catalogue.GPU_METRICS` (field f -> "infersight_gpu_" + f), never
typed here. Only whole-GPU series are exposed; MIG-instance series would collide on (gpu, uuid).
"""
from __future__ import annotations

from typing import Iterable, Iterator, Mapping, Protocol, Union

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from infersight.exporters import catalogue as C
from infersight.gpu.samples import GpuSample

GPU_PREFIX = C.P + "gpu_"


class _SamplerLike(Protocol):
    def latest(self) -> list[GpuSample]: ...

    def error_counts(self) -> dict[str, int]: ...


LatestSource = Union[_SamplerLike, Iterable[GpuSample]]


def gpu_metric_families(source: LatestSource, errors: Mapping[str, int] | None = None) -> Iterator[Metric]:
    """Families for the latest value of every whole-GPU series in `source` (a GpuSampler, or any
    iterable of samples: the newest per series wins), plus the collector error counter (from the
    sampler, or `errors`). Fields without a catalogue entry are skipped; families with no series
    are not yielded, except the error counter, which is always present when errors are known."""
    if hasattr(source, "latest"):
        sampler: _SamplerLike = source  # type: ignore[assignment]
        samples = sampler.latest()
        errors = sampler.error_counts() if errors is None else errors
    else:
        samples = list(source)  # type: ignore[arg-type]
    newest: dict[tuple[str, int, str], GpuSample] = {}
    for s in samples:
        key = (s.field, s.gpu, s.uuid)
        if s.instance == "" and (key not in newest or s.ts_ns >= newest[key].ts_ns):
            newest[key] = s
    for spec in C.GPU_METRICS:
        if spec is C.GPU_COLLECTOR_ERRORS:
            continue
        field = spec.name[len(GPU_PREFIX):]
        series = sorted((gpu, uuid, s.value) for (f, gpu, uuid), s in newest.items() if f == field)
        if not series:
            continue
        family: GaugeMetricFamily | CounterMetricFamily
        if spec.kind == "counter":
            family = CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        else:
            family = GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        for gpu, uuid, value in series:
            family.add_metric([str(gpu), uuid], value)
        yield family
    if errors is not None:
        spec = C.GPU_COLLECTOR_ERRORS
        family = CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        for collector, count in sorted(errors.items()):
            family.add_metric([collector], float(count))
        yield family
