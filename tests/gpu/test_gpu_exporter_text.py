"""parse_exposition on real dcgm-exporter scrapes (../shared/fixtures), on the hand-written 4.9-style
body, and on inline texts with DCGM blank sentinels. Expected values come from a regex over the
raw text and unit factors written out here, never from infersight's own tables."""
from __future__ import annotations

from typing import Callable

import pytest
from gpu_raw_exposition import DATA, raw_samples, raw_value

from infersight.gpu.exporter_text import parse_exposition
from infersight.gpu.samples import GpuSample

MIB = 1024 * 1024
L4_UUID = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
A100_UUID = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"


def by_key(samples: list[GpuSample]) -> dict[tuple[int, str, str], GpuSample]:
    out = {(s.gpu, s.instance, s.field): s for s in samples}
    assert len(out) == len(samples), "one sample per (gpu, instance, field)"
    return out


def test_l4_scrape_units_and_labels(shared_fixture: Callable[[str], str]) -> None:
    text = shared_fixture("dcgm_exporter_l4.prom")
    parsed = parse_exposition(text, ts_ns=123)
    got = by_key(parsed.samples)
    expect = {  # field: (exporter name, factor to base units)
        "sm_clock_hertz": ("DCGM_FI_DEV_SM_CLOCK", 1e6),                       # MHz -> Hz
        "memory_clock_hertz": ("DCGM_FI_DEV_MEM_CLOCK", 1e6),
        "temperature_celsius": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
        "memory_temperature_celsius": ("DCGM_FI_DEV_MEMORY_TEMP", 1.0),
        "power_watts": ("DCGM_FI_DEV_POWER_USAGE", 1.0),                        # W stays W
        "energy_joules": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),        # mJ -> J
        "utilization_ratio": ("DCGM_FI_DEV_GPU_UTIL", 0.01),                    # % -> ratio
        "memory_copy_utilization_ratio": ("DCGM_FI_DEV_MEM_COPY_UTIL", 0.01),
        "memory_free_bytes": ("DCGM_FI_DEV_FB_FREE", MIB),                      # MiB -> bytes
        "memory_used_bytes": ("DCGM_FI_DEV_FB_USED", MIB),
        "gr_engine_active_ratio": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0),
        "tensor_active_ratio": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1.0),
        "dram_active_ratio": ("DCGM_FI_PROF_DRAM_ACTIVE", 1.0),
        "pcie_tx_bytes_per_second": ("DCGM_FI_PROF_PCIE_TX_BYTES", 1.0),
        "pcie_rx_bytes_per_second": ("DCGM_FI_PROF_PCIE_RX_BYTES", 1.0),
    }
    assert set(f for _, _, f in got) == set(expect)
    for field, (name, factor) in expect.items():
        s = got[(0, "", field)]
        assert s.value == pytest.approx(raw_value(text, name) * factor), field
        assert (s.uuid, s.ts_ns) == (L4_UUID, 123)
    # Spot checks against the numbers in PROVENANCE.md / the file itself.
    assert got[(0, "", "power_watts")].value == pytest.approx(16.365)
    assert got[(0, "", "energy_joules")].value == pytest.approx(4742.776)
    assert got[(0, "", "memory_free_bytes")].value == 22563 * MIB
    ident = parsed.gpus[(0, L4_UUID, "")]
    assert (ident.model, ident.hostname, ident.driver, ident.pci_bus_id) == \
        ("NVIDIA L4", "i-030791dc5a37cd257", "580.105.08", "00000000:31:00.0")
    assert parsed.hostname_labels == {"Hostname"} and parsed.schemes == {"legacy"}
    # Counters typed `counter` come back from the parser as NAME_total; they are matched (energy
    # above) or listed under their exporter name.
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" in parsed.unmapped
    assert not any(n.endswith("_total") for n in parsed.unmapped)
    # Every DCGM sample line of the file is accounted for: mapped or unmapped, none lost.
    names = {n for n, _, _ in raw_samples(text)}
    assert parsed.dcgm_series == len(raw_samples(text)) == 23
    assert len(got) + len(parsed.unmapped) == len(names) and not parsed.blanks


def test_a100_mig_scrape_keeps_instances_apart(shared_fixture: Callable[[str], str]) -> None:
    text = shared_fixture("dcgm_exporter_a100_mig.prom")
    parsed = parse_exposition(text, ts_ns=0)
    got = by_key(parsed.samples)
    for field, name in (("gr_engine_active_ratio", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
                        ("tensor_active_ratio", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
                        ("dram_active_ratio", "DCGM_FI_PROF_DRAM_ACTIVE")):
        assert got[(0, "", field)].value == raw_value(text, name)
        assert got[(0, "13", field)].value == raw_value(text, name, instance="13")
    assert got[(0, "", "dram_active_ratio")].value == pytest.approx(0.690789)
    assert got[(0, "13", "dram_active_ratio")].value == pytest.approx(0.800339)
    assert got[(0, "", "energy_joules")].value == pytest.approx(319159391 / 1000)
    assert got[(0, "", "memory_used_bytes")].value == 4845 * MIB
    assert got[(0, "", "power_watts")].value == pytest.approx(409.692)
    assert {k[1] for k in got} == {"", "13"}
    mig = parsed.gpus[(0, A100_UUID, "13")]
    assert (mig.profile, mig.hostname, mig.model) == ("1g.5gb", "ub20-a100-k8s", "")  # no modelName in this older set
    assert parsed.gpus[(0, A100_UUID, "")].instance == ""
    # No HELP/TYPE lines, families not contiguous (XID_ERRORS twice): all 21 samples seen.
    assert parsed.dcgm_series == len(raw_samples(text)) == 21
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"} <= parsed.unmapped


def test_dcgm_exporter_4_9_style_body() -> None:
    text = (DATA / "dcgm_exporter_4_9_h200.prom").read_text()
    parsed = parse_exposition(text, ts_ns=7)
    got = by_key(parsed.samples)
    # 4.9 names are already in base units: every factor is 1.
    pairs = {"sm_clock_hertz": "DCGM_FI_DEV_SM_CLOCK_HERTZ", "memory_clock_hertz": "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ",
             "power_watts": "DCGM_FI_DEV_BOARD_POWER_WATTS", "energy_joules": "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
             "utilization_ratio": "DCGM_FI_DEV_GPU_UTIL_RATIO", "memory_used_bytes": "DCGM_FI_DEV_FB_USED_BYTES",
             "memory_total_bytes": "DCGM_FI_DEV_FB_CAPACITY_BYTES",
             "temperature_celsius": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
             "sm_active_ratio": "DCGM_FI_PROF_SM_UTIL_RATIO",
             "tensor_active_ratio": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
             "dram_active_ratio": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
             "sm_occupancy_ratio": "DCGM_FI_PROF_SM_OCCUPANCY_RATIO"}
    for field, name in pairs.items():
        for gpu in ("0", "1"):
            assert got[(int(gpu), "", field)].value == raw_value(text, name, gpu), (field, gpu)
    assert got[(0, "", "sm_clock_hertz")].value == 1.98e9
    assert got[(0, "", "energy_joules")].value == 8123456.0          # joules, not mJ
    assert got[(0, "", "memory_used_bytes")].value == 133143986176.0  # bytes, not MiB
    assert got[(1, "2", "tensor_active_ratio")].value == pytest.approx(0.288)
    assert parsed.schemes == {"4.9"} and parsed.hostname_labels == {"hostname"}
    ident = parsed.gpus[(0, "GPU-0f6c1a52-8d3e-4b7a-9c21-5e4d3b2a1f00", "")]
    assert (ident.hostname, ident.driver, ident.model) == ("h200-node-07", "595.45.04", "NVIDIA H200")
    assert parsed.gpus[(1, "GPU-7a3e9d10-2b4c-4f6e-8a1d-0c9b8e7f6a51", "2")].profile == "3g.71gb"
    assert {"DCGM_FI_DEV_XID_ERROR", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL"} <= parsed.unmapped


BLANKS = """\
DCGM_FI_PROF_NVLINK_TX_BYTES{gpu="0",UUID="GPU-x",hostname="h"} 9223372036854775794
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-x",hostname="h"} 140737488355328.000000
DCGM_FI_PROF_SM_OCCUPANCY{gpu="0",UUID="GPU-x",hostname="h"} 1.40737488355330e+14
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x",hostname="h"} 2147483632
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-x",hostname="h"} 2147483634
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-x",hostname="h"} NaN
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-x",hostname="h"} 2147483700
DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-x",hostname="h"} 0.25
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{UUID="GPU-x",hostname="h"} 0.5
"""


def test_blank_sentinels_are_dropped() -> None:
    parsed = parse_exposition(BLANKS, ts_ns=0)
    got = by_key(parsed.samples)
    # Kept: a real ratio, and an energy counter that merely passed 2**31 mJ (not one of the codes).
    assert set(got) == {(0, "", "dram_active_ratio"), (0, "", "energy_joules")}
    assert got[(0, "", "energy_joules")].value == pytest.approx(2147483.7)
    meanings = {b.name: b.meaning for b in parsed.blanks}
    assert meanings == {"DCGM_FI_PROF_NVLINK_TX_BYTES": "blank",       # int64 family (>= 2**63 - 16)
                        "DCGM_FI_PROF_SM_ACTIVE": "blank",             # fp64 2**47
                        "DCGM_FI_PROF_SM_OCCUPANCY": "not supported",  # fp64 2**47 + 2
                        "DCGM_FI_DEV_GPU_UTIL": "blank",               # int32 0x7ffffff0
                        "DCGM_FI_DEV_GPU_TEMP": "not supported",       # int32 0x7ffffff2
                        "DCGM_FI_DEV_POWER_USAGE": "blank"}            # NaN
    assert parsed.no_gpu_label == 1  # the series without a gpu label is skipped, not guessed


def test_mixed_schemes_and_both_hostname_spellings() -> None:
    text = ('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",Hostname="old"} 2\n'
            'DCGM_FI_DEV_FB_USED_BYTES{gpu="1",UUID="GPU-b",hostname="new"} 2\n'
            'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a",Hostname="old"} 1500\n'
            'DCGM_FI_DEV_SM_CLOCK_HERTZ{gpu="1",UUID="GPU-b",hostname="new"} 1500\n')
    parsed = parse_exposition(text, ts_ns=0)
    got = by_key(parsed.samples)
    assert got[(0, "", "memory_used_bytes")].value == 2 * MIB and got[(1, "", "memory_used_bytes")].value == 2
    assert got[(0, "", "sm_clock_hertz")].value == 1.5e9 and got[(1, "", "sm_clock_hertz")].value == 1500
    assert parsed.schemes == {"legacy", "4.9"} and parsed.hostname_labels == {"Hostname", "hostname"}
    assert parsed.gpus[(0, "GPU-a", "")].hostname == "old" and parsed.gpus[(1, "GPU-b", "")].hostname == "new"


def test_invalid_text_raises_value_error() -> None:
    with pytest.raises(ValueError):
        parse_exposition("<html><body>502 Bad Gateway</body></html>", ts_ns=0)
