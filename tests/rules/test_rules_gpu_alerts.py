"""The GPU fault alerts under `promtool test rules`, on series named as dcgm-exporter names them:
an XID error, thermal and power throttling. One GPU is sick, another healthy beside it."""
from __future__ import annotations

from pathlib import Path

import pytest

from infersight.exporters.rules import dcgm
from rules_promtool import needs_promtool
from rules_scenario import rule_files, run_case
from rules_series import counter_values, gauge_values, selector

pytestmark = needs_promtool
FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
#: dcgm-exporter's labels (the A100 sample in shared/fixtures has gpu, UUID, device, Hostname).
EXPORTER = {"job": "dcgm-exporter", "instance": "10.0.1.2:9400", "device": "nvidia0", "Hostname": "gpu-node-a"}
GPU0 = {**EXPORTER, "gpu": "0", "UUID": "GPU-34319582-d595-d1c7-d1d2-179bcfa61660",
        "namespace": "llm", "pod": "vllm-0"}
GPU1 = {**EXPORTER, "gpu": "1", "UUID": "GPU-7a0c81a2-0000-4c8e-9d1e-5b2f0e1c9a11", "device": "nvidia1"}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return rule_files(tmp_path_factory.mktemp("gpu_rules"))


def test_xid_name_is_dcgm_exporters() -> None:
    """The XID series is named as a real dcgm-exporter scrape names it."""
    sample = FIXTURES / "dcgm_exporter_a100_mig.prom"
    if not sample.exists():
        pytest.skip(f"no dcgm-exporter sample at {sample}")
    names = {line.split("{")[0] for line in sample.read_text().splitlines() if line and not line.startswith("#")}
    assert dcgm.XID_ERRORS.name in names


def test_xid_error(files: list[Path], tmp_path: Path) -> None:
    # GPU 0 reports XID 79 (fallen off the bus) from 5m on; GPU 1 stays at 0. No "for": firing at 5m.
    series = [{"series": selector(dcgm.XID_ERRORS.name, GPU0), "values": "0x4 79x25"},
              {"series": selector(dcgm.XID_ERRORS.name, GPU1), "values": gauge_values([(30, 0)])}]
    run_case(tmp_path, files, series, "InfersightGpuXidError", [("3m", []), ("5m", [(GPU0, 79)])])


@pytest.mark.parametrize("series_spec, alertname", [(dcgm.THERMAL_VIOLATION, "InfersightGpuThermalThrottling"),
                                                     (dcgm.POWER_VIOLATION, "InfersightGpuPowerThrottling")])
def test_throttling(files: list[Path], tmp_path: Path, series_spec: dcgm.DcgmSeries, alertname: str) -> None:
    # The violation counters count throttled microseconds. GPU 0: 12 s throttled per minute (20%,
    # over the 10%), GPU 1: 1.2 s (2%). The counters start at 0 and rate() divides by its whole
    # 10-minute window, so at t minutes (t < 10) GPU 0 shows 20% * t/10: over 10% from 6m, and
    # "for: 10m" makes it firing from 16m (pending at 15m).
    series = [{"series": selector(series_spec.name, GPU0), "values": counter_values([(30, 12e6)])},
              {"series": selector(series_spec.name, GPU1), "values": counter_values([(30, 1.2e6)])}]
    run_case(tmp_path, files, series, alertname, [("15m", []), ("16m", [(GPU0, 12 / 60)])])
