"""GpuTelemetryConfig validation, the auto-detect order (DCGM, exporter URL, NVML, none) with
injected fakes, and the none collector."""
from __future__ import annotations

from typing import Any

import pytest
from gpu_fakes import FakeDcgm, FakeFieldValue, FakeGpuState, FakeNvml

from infersight.gpu.config import GpuTelemetryConfig
from infersight.gpu.detect import open_collector
from infersight.gpu.none_collector import NoneCollector

GOOD = b'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a"} 100\n'


class Response:
    status = 200

    def __init__(self, body: bytes) -> None:
        self.body = body

    def read(self, amt: int = -1) -> bytes:
        return self.body

    def close(self) -> None:
        pass


def opener_of(body: bytes | None) -> Any:
    def open_(url: str, timeout_s: float) -> Response:
        if body is None:
            raise OSError("connection refused")
        return Response(body)
    return open_


def dcgm(running: bool) -> Any:
    return FakeDcgm({0: ("GPU-a", "NVIDIA H200")}, {1: {0: {155: [FakeFieldValue(1.0)]}}}, running).bindings()


def nvml() -> FakeNvml:
    return FakeNvml([FakeGpuState(uuid="GPU-a")])


@pytest.mark.parametrize("kwargs", [dict(source="gpu"), dict(interval_s=0.05), dict(timeout_s=0),
                                    dict(ring_size=0), dict(source="dcgm-exporter"),
                                    dict(url="file:///etc/passwd"), dict(url="localhost:9400")])
def test_config_rejects(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        GpuTelemetryConfig(**kwargs)


def test_config_defaults_and_fast_interval() -> None:
    c = GpuTelemetryConfig(interval_s=0.1, url="http://127.0.0.1:9400/metrics")
    assert (c.source, c.interval_s, c.gpm) == ("auto", 0.1, True)


def test_auto_prefers_dcgm_then_exporter_then_nvml() -> None:
    cfg = GpuTelemetryConfig(url="http://127.0.0.1:9400/metrics")
    assert open_collector(cfg, dcgm_bindings=dcgm(True), nvml=nvml(), opener=opener_of(GOOD)).name == "dcgm"
    assert open_collector(cfg, dcgm_bindings=dcgm(False), nvml=nvml(), opener=opener_of(GOOD)).name == "dcgm-exporter"
    # An exporter that does not answer now is skipped in auto mode.
    assert open_collector(cfg, dcgm_bindings=dcgm(False), nvml=nvml(), opener=opener_of(None)).name == "nvml"
    # Without a URL the exporter is not tried at all.
    assert open_collector(GpuTelemetryConfig(), dcgm_bindings=dcgm(False), nvml=nvml()).name == "nvml"


def test_nothing_available_gives_the_none_collector_with_reasons() -> None:
    class NoLibrary(FakeNvml):
        def nvmlInit(self) -> None:
            raise OSError("NVML Shared Library Not Found")

    c = open_collector(GpuTelemetryConfig(url="http://127.0.0.1:9400/metrics"), dcgm_bindings=dcgm(False),
                       nvml=NoLibrary([]), opener=opener_of(None))
    assert isinstance(c, NoneCollector) and c.poll() == []
    line = c.status_line()
    assert line.startswith("GPU telemetry: off (dcgm: ") and "dcgm-exporter: " in line and "NVML Shared Library" in line
    c.close()


def test_explicit_source_is_the_only_one_tried() -> None:
    # An explicit exporter is kept even if it is down right now: the sampler counts its errors.
    cfg = GpuTelemetryConfig(source="dcgm-exporter", url="http://127.0.0.1:9400/metrics")
    assert open_collector(cfg, dcgm_bindings=dcgm(True), opener=opener_of(None)).name == "dcgm-exporter"
    c = open_collector(GpuTelemetryConfig(source="dcgm"), dcgm_bindings=dcgm(False), nvml=nvml())
    assert c.name == "none" and "dcgm:" in c.status_line() and "nvml" not in c.status_line()
    off = open_collector(GpuTelemetryConfig(source="none"), dcgm_bindings=dcgm(True), nvml=nvml())
    assert off.name == "none" and off.status_line() == "GPU telemetry: off (source=none in the configuration)"
