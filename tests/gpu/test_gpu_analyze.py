"""analyze_exposition / format_exposition_table on the shared scrapes, the 4.9-style body, a
non-GPU Prometheus file, text with sentinels, and text that is not exposition at all."""
from __future__ import annotations

import json
from typing import Callable

import pytest
from gpu_raw_exposition import DATA, raw_value

from infersight.gpu.analyze import analyze_exposition, format_exposition_table


def sample(result: dict, field: str, gpu: int = 0, instance: str = "") -> dict:
    hits = [s for s in result["samples"] if (s["field"], s["gpu"], s["instance"]) == (field, gpu, instance)]
    assert len(hits) == 1, (field, gpu, instance)
    return hits[0]


def test_l4(shared_fixture: Callable[[str], str]) -> None:
    text = shared_fixture("dcgm_exporter_l4.prom")
    r = analyze_exposition(text)
    json.dumps(r)  # JSON-ready
    assert (r["source"], r["scheme"], r["hostname_label"]) == ("dcgm-exporter", "legacy", "Hostname")
    assert r["gpus"] == [{"gpu": 0, "uuid": "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c", "instance": "", "profile": "",
                          "model": "NVIDIA L4", "hostname": "i-030791dc5a37cd257", "driver": "580.105.08",
                          "pci_bus_id": "00000000:31:00.0"}]
    assert sample(r, "memory_free_bytes") == {"gpu": 0, "uuid": "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
                                              "instance": "", "field": "memory_free_bytes",
                                              "value": raw_value(text, "DCGM_FI_DEV_FB_FREE") * 2**20, "unit": "bytes"}
    assert sample(r, "sm_clock_hertz")["value"] == raw_value(text, "DCGM_FI_DEV_SM_CLOCK") * 1e6
    assert sample(r, "energy_joules")["unit"] == "joules"
    assert r["warnings"] == []
    table = format_exposition_table(r)
    assert "NVIDIA L4" in table and "memory_free_bytes" in table and "22.0 GiB" in table and "16.365 W" in table


def test_a100_mig_and_4_9(shared_fixture: Callable[[str], str]) -> None:
    r = analyze_exposition(shared_fixture("dcgm_exporter_a100_mig.prom"))
    assert [(g["gpu"], g["instance"], g["profile"]) for g in r["gpus"]] == [(0, "", ""), (0, "13", "1g.5gb")]
    assert sample(r, "tensor_active_ratio", instance="13")["value"] == pytest.approx(0.930433)
    assert "GPU_I_ID=13" in format_exposition_table(r)
    r49 = analyze_exposition((DATA / "dcgm_exporter_4_9_h200.prom").read_text())
    assert (r49["scheme"], r49["hostname_label"]) == ("4.9", "hostname")
    assert {g["driver"] for g in r49["gpus"]} == {"595.45.04"}
    assert sample(r49, "memory_total_bytes", gpu=1)["value"] == 150754820096
    assert r49["warnings"] == []


def test_not_a_gpu_file(shared_fixture: Callable[[str], str]) -> None:
    r = analyze_exposition(shared_fixture("vllm_metrics_sample.prom"))
    assert (r["source"], r["samples"], r["gpus"]) == ("prometheus", [], [])
    assert r["warnings"] == ["no DCGM series: no GPU telemetry in this file"]
    assert "warning: no DCGM series" in format_exposition_table(r)


def test_warnings_for_blanks_percent_ratios_and_bad_text() -> None:
    text = ('DCGM_FI_PROF_DRAM_ACTIVE{gpu="1",UUID="GPU-x",GPU_I_ID="5",GPU_I_PROFILE="1g.10gb"} 140737488355331\n'
            'DCGM_FI_DEV_GPU_UTIL_RATIO{gpu="0",UUID="GPU-x",hostname="h"} 37\n'
            'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x",Hostname="h"} 2147483633\n')
    r = analyze_exposition(text)
    assert r["scheme"] == "mixed"
    w = "\n".join(r["warnings"])
    assert "dropped DCGM blank value (no permission): DCGM_FI_PROF_DRAM_ACTIVE gpu 1 MIG 5" in w
    assert "dropped DCGM blank value (not found): DCGM_FI_DEV_GPU_UTIL gpu 0" in w
    assert "utilization_ratio on gpu 0 is 37, above 1" in w
    assert "both `Hostname` and `hostname`" in w and "pre-4.9 and 4.9" in w
    bad = analyze_exposition("{\"not\": \"prometheus\"}")
    assert bad["source"] == "prometheus" and bad["warnings"][0].startswith("not valid Prometheus text")
    assert "[brackets]" in format_exposition_table({**bad, "warnings": ["[brackets] kept verbatim"]})
